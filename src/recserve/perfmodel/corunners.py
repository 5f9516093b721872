"""Co-runner interference: what the other threads on a socket do to one worker's call (Hercules §III-A).

Threads of one allocation share the model's tables and weights (``tables="shared"``) or hold a copy each
(``"copied"``, already split by the LLC share per copy in ``PerfModel._static``).  Beside one worker run the
allocation's other host threads, its co-runners; they slow its call through

- **the LLC**: each co-runner's call in flight keeps its private tensors there (the ids and offsets it gathers by,
  its pooled embeddings, its dense inputs: ``private_bytes_per_item`` per item of its sub-batch), and those bytes
  are taken off the LLC that holds the shared hot rows and dense weights.  What no longer fits is gathered or
  streamed from DRAM (more DRAM time and more DRAM bytes).  A worker's own private data is not charged: the
  calibration was fitted on one thread, whose own data was in the LLC when it was timed.
- **memory bandwidth**: the DRAM bytes/s of all threads together against ``mem_bw_gbs · membw_eff`` slow every
  DRAM byte by ``1 + u²/(2(1−u))`` (``PerfModel._slowdown``; at a given load the co-runners' bytes/s are the
  load's, so the LLC term above is what makes them grow with the threads: every co-runner's extra misses).

At latency-bounded max load the CPU threads are busy most of the time (0.66-0.97 at DeepRecSys' points on
Hercules' T1), so every co-runner is counted as running.  One thread has no co-runner: the model then is what it
was without this term.
"""

from __future__ import annotations

import math
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from recserve.perfmodel.cost import ModelCost
from recserve.perfmodel.queueing import SizeMix

if TYPE_CHECKING:
    from recserve.perfmodel.model import Allocation, PerfModel
    from recserve.specs import ModelSpec, ServerType


def private_bytes_per_item(cost: ModelCost) -> float:
    """Bytes per item a call keeps of its own while it runs: int64 ids (offsets are per bag, included at 8 B per
    table), pooled embeddings, dense inputs.  Shared tables and weights are not private."""
    return cost.index_bytes_per_item + 8.0 * cost.tables + cost.pooled_bytes_per_item + cost.dense_in_bytes_per_item


def corunner_threads(alloc: Allocation) -> int:
    """Host threads beside one worker of ``alloc``: the other model-based (or DenseNet) threads and the SparseNet
    threads of a pipeline."""
    return max(alloc.workers + alloc.sparse_workers - 1, 0)


def displaced_llc_bytes(cost: ModelCost, alloc: Allocation, items: float) -> float:
    """LLC bytes the co-runners' calls of ``items`` items (the sub-batch) keep private."""
    return corunner_threads(alloc) * items * private_bytes_per_item(cost)


def job_items(alloc: Allocation, mix: SizeMix) -> float:
    """Mean items of one call when the mix's queries are split into sub-batches of at most ``alloc.batch``."""
    calls = np.ceil(mix.sizes / alloc.batch) if alloc.batch else np.ones(len(mix.sizes))
    return mix.mean / float(mix.probs @ calls)


@cache
def default_mean_items() -> float:
    """Items of one whole query of the default mix, on average (a call's size when none is given)."""
    return SizeMix.of(None).mean


def back_to_back_ms(pm: PerfModel, spec: ModelSpec, server: ServerType, batch: int, threads: int,
                    iterations: int = 50) -> float:
    """ms per call of one of ``threads`` single-core threads sharing one copy of the tables, each running calls of
    ``batch`` items back to back (what ``benchmarks/bench_thread_interference.py`` measures): the LLC left by the
    co-runners' private data and the DRAM slowdown at the bytes/s the threads demand together, a damped fixed
    point since that demand depends on the call time."""
    from recserve.perfmodel.model import Allocation

    alloc = Allocation(workers=threads, batch=batch)
    t = pm.latency_ms(spec, server, batch, alloc, 0.0)
    for _ in range(iterations):
        nxt = pm.latency_ms(spec, server, batch, alloc, threads * 1000.0 / t)
        if abs(nxt - t) <= 1e-5 * t:
            return nxt
        t = math.sqrt(t * nxt)
    return t
