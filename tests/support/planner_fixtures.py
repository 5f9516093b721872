"""Small synthetic Profile sets for the planner tests (built here, not measured)."""

from __future__ import annotations

import numpy as np

from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import ServerType

NODE = ServerType(name="test-node", cores=16, mem_gb=192, mem_bw_gbs=76.8, llc_mb=22, llc_ways=11)


def hera_like_profiles(server: ServerType = NODE) -> tuple[ProfileSet, dict[str, str]]:
    """Eight models shaped like Hera's: capacity-bound, bandwidth-bound and cache-sensitive compute models.

    Returns the profiles and each model's intended scalability class.
    """
    W, K = server.cores, server.llc_ways
    # name: (qps per worker, knee workers or None, max workers by memory, GB/s per worker, cache sensitivity, GB/worker)
    shapes = {
        "dlrm-a": (40.0, None, W, 4.0, 0.05, 2.0),
        "dlrm-b": (10.0, None, 8, 3.0, 0.05, 23.0),
        "dlrm-c": (30.0, None, W, 1.0, 0.3, 2.5),
        "dlrm-d": (25.0, 12, W, 6.0, 0.1, 8.0),
        "ncf": (900.0, None, W, 0.5, 0.6, 0.2),
        "dien": (120.0, None, W, 0.8, 0.4, 4.0),
        "din": (60.0, None, W, 0.8, 0.5, 3.0),
        "wnd": (200.0, None, W, 0.6, 0.45, 3.5),
    }
    classes = {"dlrm-b": "low", "dlrm-d": "low"}
    tables = []
    for name, (per, knee, max_w, gbs, sens, gb) in shapes.items():
        ws = np.arange(1, max_w + 1)
        eff = np.minimum(ws, knee + 0.04 * (ws - knee) * 4) if knee else ws.astype(float)
        qps = per * eff
        tables.append(ProfileTable(name, server.name, "maxload_vs_workers", ("workers", "max_qps"),
                                   [[float(w), float(q)] for w, q in zip(ws, qps, strict=True)], source="modelled"))
        ways = np.arange(1, K + 1)
        ratio = 1.0 - sens * np.exp(-(ways - 1) / 2.0) * (ways < K)
        full = qps[-1]
        tables.append(ProfileTable(name, server.name, "maxload_vs_ways", ("ways", "max_qps"),
                                   [[float(k), float(full * r)] for k, r in zip(ways, ratio, strict=True)],
                                   source="modelled"))
        ws_all = np.arange(1, W + 1)
        tables.append(ProfileTable(name, server.name, "membw_vs_workers", ("workers", "gbs"),
                                   [[float(w), float(gbs * min(w, knee or w))] for w in ws_all], source="modelled"))
        tables.append(ProfileTable(name, server.name, "footprint", ("workers", "mem_gb"),
                                   [[float(w), float(gb * w)] for w in ws_all], source="modelled"))
        classes.setdefault(name, "high")
    return ProfileSet(tables), classes


def efficiency_profiles(qps: dict[tuple[str, str], float], power: dict[tuple[str, str], float]) -> ProfileSet:
    """``efficiency`` tables from {(workload, server): value} dictionaries."""
    return ProfileSet([ProfileTable(w, h, "efficiency", ("max_qps", "power_w"), [[q, power[(w, h)]]],
                                    source="modelled") for (w, h), q in qps.items()])
