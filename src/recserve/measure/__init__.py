"""Measurement: open-loop load generator, max-load (latency-bounded QPS) search, host profiler.

The names below are imported lazily so that ``recserve.measure.maxload`` (a pure function the
simulator reuses) does not pull in torch or the network clients.  See ``docs/measure.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "run_load": "loadgen", "LoadSession": "loadgen", "LoadResult": "loadgen",
    "find_max_load": "maxload", "MaxLoadResult": "maxload", "Probe": "maxload",
    "RequestPool": "requests", "poisson_gaps": "requests", "arrival_times": "requests",
    "HttpTarget": "targets", "GrpcTarget": "targets", "InProcessTarget": "targets", "RequestFailed": "targets",
    "make_target": "targets", "LocalServer": "served", "profile_host": "profiler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'recserve.measure' has no attribute {name!r}")
    return getattr(importlib.import_module(f"recserve.measure.{module}"), name)
