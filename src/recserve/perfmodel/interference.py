"""Measured interference (``measure/interference.py``) in the forms the planners and the simulator use.

- :class:`Interference`: a model's slowdown vs the LLC it may use and under a streaming co-runner;
  ``llc_sensitivity``/``memory_fraction`` are the co-location simulator's (``sim/node.py``) parameters fitted to it;
- :func:`hera_ways_tables`: Hera's 3-D lookup QPS[model][workers][ways] from the measured LLC curve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recserve.profiles import ProfileSet, ProfileTable

HOST = "this-host"


@dataclass(frozen=True)
class Interference:
    """A model's measured sensitivities, in the forms the planners and the simulator use."""

    model: str
    llc_mb: float
    occupied_mb: tuple[float, ...]
    slowdown_llc: tuple[float, ...]
    corunner_gbs: float
    slowdown_bw: float

    def llc_slowdown(self, available_mb: float) -> float:
        """Slowdown when the model may use ``available_mb`` of the LLC (interpolated; 1 at the whole LLC)."""
        avail = np.clip(self.llc_mb - np.asarray(self.occupied_mb), 0.0, None)
        order = np.argsort(avail)
        x = np.concatenate([avail[order], [self.llc_mb]])
        y = np.concatenate([np.asarray(self.slowdown_llc)[order], [1.0]])
        return float(max(1.0, np.interp(available_mb, x, y)))

    def llc_sensitivity(self, ways: int) -> float:
        """The simulator's ``llc_sensitivity``: its curve 1 + s·((W-k)/(W-1))² fitted to the measured points."""
        if ways <= 1:
            return 0.0
        k = np.clip(ways * (1 - np.asarray(self.occupied_mb) / self.llc_mb), 1, ways)
        missing = ((ways - k) / (ways - 1)) ** 2
        excess = np.asarray(self.slowdown_llc) - 1.0
        denom = float((missing * missing).sum())
        return max(0.0, float((missing * excess).sum() / denom)) if denom > 0 else 0.0

    def memory_fraction(self) -> float:
        """The simulator's ``memory_fraction`` (slowdown − 1 per unit of bandwidth over-subscription): the
        streaming co-runner is taken to saturate the bus alone, so with the model beside it demand is twice
        what the bus gives (over-subscription 1) — an assumption, since the host's peak is not measured here."""
        return max(0.0, self.slowdown_bw - 1.0)


def fit_interference(profiles: ProfileSet, model: str, server: str = HOST) -> Interference:
    llc = profiles.get(model, server, "slowdown_vs_llc_occupied")
    bw = profiles.get(model, server, "slowdown_vs_corunner_gbs")
    llc_mb = float(profiles.meta.get("llc_mb", max(llc.column("occupied_mb"))))
    return Interference(model, llc_mb, tuple(llc.column("occupied_mb").tolist()),
                        tuple(llc.column("slowdown").tolist()), float(bw.column("corunner_gbs")[-1]),
                        float(bw.column("slowdown")[-1]))


def hera_ways_tables(interference: Interference, maxload_vs_workers: ProfileTable, server: str, ways: int,
                     llc_mb: float) -> list[ProfileTable]:
    """Hera's QPS[model][workers][ways] from measured LLC sensitivity: w workers on k of ``ways`` ways share
    k/ways of ``llc_mb``, so each sees (k/ways)·llc_mb / w; QPS = QPS_alone(w) / slowdown(that share) ÷
    slowdown(llc_mb / w) — normalised to the full cache at each worker count, and depending on w and k
    jointly through the per-worker share (not a product of a worker curve and a ways curve)."""
    per_mb = interference.llc_mb / llc_mb  # measured host MB per modelled server MB (same share of the LLC)
    out = []
    pairs = list(zip(maxload_vs_workers.column("workers"), maxload_vs_workers.column("max_qps"), strict=True))
    served = [w for w, q in pairs if q > 0]
    whole = max(served) if served else None
    for w, qps in pairs:
        full = interference.llc_slowdown(llc_mb / w * per_mb)
        rows = [[float(k), float(qps) * full / interference.llc_slowdown(k / ways * llc_mb / w * per_mb), float(w)]
                for k in range(1, ways + 1)]
        for cond in ([{}] if w == whole else []) + [{"workers": int(w)}]:  # whole-server table first, as perfmodel
            out.append(ProfileTable(maxload_vs_workers.model, server, "maxload_vs_ways",
                                    ("ways", "max_qps", "workers"), rows, "modelled", cond))
    return out


def with_measured_ways(profiles: ProfileSet, server: str, measured: dict[str, Interference], llc_mb: float,
                       ways: int) -> ProfileSet:
    """``profiles`` with every ``maxload_vs_ways`` table of the models in ``measured`` (model -> its measured
    interference) replaced by :func:`hera_ways_tables` on ``server``."""
    out = ProfileSet(meta={**profiles.meta, "maxload_vs_ways": f"from measured LLC sensitivity: {sorted(measured)}"})
    for t in profiles:
        if not (t.kind == "maxload_vs_ways" and t.server == server and t.model in measured):
            out.add(t)
    for model, inter in measured.items():
        workers = profiles.get(model, server, "maxload_vs_workers")
        for t in hera_ways_tables(inter, workers, server, ways, llc_mb):
            out.add(t)
    return out


