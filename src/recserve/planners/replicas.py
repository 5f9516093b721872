"""The replica rule, in one place: whole replicas so that none carries more than its sustainable rate.

ElasticRec's planner (Alg. 1 REPLICAS), the live shard deployment (replicas from measured rates) and
the shard autoscaler (sparse shards on observed QPS) all size a service this way.
"""

from __future__ import annotations

import numpy as np


def replicas_for(target_qps: float | np.ndarray, qps_per_replica: float | np.ndarray) -> np.ndarray | int:
    """``ceil(target / rate)``, at least one (the paper writes ``//``; a replica count is whole).
    Arrays in, array out; scalars in, an ``int`` out."""
    need = np.maximum(1, np.ceil(np.asarray(target_qps, dtype=float) / np.asarray(qps_per_replica, dtype=float)
                                 - 1e-9))
    return int(need) if need.ndim == 0 else need
