"""Diurnal load traces: QPS per time step for one or more models over a day (or several).

Hercules (Sec. II-A, Fig. 2d) observes daily peaks and valleys that are *synchronous* across datacenters and
across services, with about 50% fluctuation between peak and off-peak: the default peak/valley ratio is 2.
The shape is a raised cosine with one peak per day at ``peak_hour``::

    s(t)   = ((1 + cos(2π (t - peak_hour) / 24 h)) / 2) ** sharpness        # 1 at the peak, 0 at the valley
    qps(t) = peak · (1/ratio + (1 - 1/ratio) · s(t)) · (1 + noise · ε_model,t)

``sharpness`` > 1 narrows the peak.  Every model shares ``s(t)`` (synchronous); the multiplicative noise
``ε`` is standard normal, independent per model and step, from ``seed``.  ``peak`` is the peak of the
noiseless curve, so a noisy trace can exceed it slightly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recserve.workload._common import RngLike, WorkloadError, as_rng

DAY_S = 24 * 3600.0


@dataclass
class DiurnalTrace:
    """QPS of each model on consecutive steps of ``step_s`` seconds starting at ``times_s``."""

    step_s: float
    times_s: np.ndarray
    qps: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.times_s = np.asarray(self.times_s, dtype=float)
        self.qps = {m: np.asarray(v, dtype=float) for m, v in self.qps.items()}
        if not self.step_s > 0 or self.times_s.ndim != 1 or self.times_s.size == 0:
            raise WorkloadError("a trace needs a positive step and at least one time step")
        if not self.qps:
            raise WorkloadError("a trace needs at least one model")
        for model, series in self.qps.items():
            if series.shape != self.times_s.shape:
                raise WorkloadError(f"trace model {model!r}: {series.size} values for {self.times_s.size} steps")
            if not np.all(np.isfinite(series)) or np.any(series < 0):
                raise WorkloadError(f"trace model {model!r}: QPS must be finite and >= 0")

    @property
    def models(self) -> list[str]:
        return list(self.qps)

    def total(self) -> np.ndarray:
        """Aggregate QPS over all models per step."""
        return np.sum(list(self.qps.values()), axis=0)

    def at(self, model: str, t_s: float | np.ndarray) -> np.ndarray:
        """QPS of ``model`` at time(s) ``t_s`` (piecewise constant; clamps outside the trace)."""
        idx = np.clip(np.searchsorted(self.times_s, t_s, side="right") - 1, 0, self.times_s.size - 1)
        return self.series(model)[idx]

    def series(self, model: str) -> np.ndarray:
        if model not in self.qps:
            raise WorkloadError(f"trace has no model {model!r}; it has {', '.join(self.qps)}")
        return self.qps[model]

    def arrivals(self, model: str, rng: RngLike = 0) -> np.ndarray:
        """Poisson arrival times (s) following this model's QPS step by step."""
        from recserve.workload.arrivals import piecewise_poisson_arrivals

        return piecewise_poisson_arrivals(self.times_s, self.series(model), rng)

    def scaled(self, factor: float) -> DiurnalTrace:
        return DiurnalTrace(self.step_s, self.times_s.copy(), {m: v * factor for m, v in self.qps.items()},
                            {**self.meta, "scaled_by": factor})

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for model, series in {**self.qps, **({"total": self.total()} if len(self.qps) > 1 else {})}.items():
            peak, valley = float(series.max()), float(series.min())
            out[model] = {"peak": peak, "valley": valley, "mean": float(series.mean()),
                          "peak_over_valley": peak / valley if valley > 0 else float("inf"),
                          "peak_hour": float(self.times_s[int(series.argmax())] / 3600.0)}
        return out

    # ---- files ----------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """``.json`` (with meta) or ``.csv`` (``time_s,<model>…``, meta in a leading ``#`` comment)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".csv":
            header = ",".join(["time_s", *self.qps])
            rows = [",".join([f"{t:g}", *(f"{self.qps[m][i]:.6g}" for m in self.qps)])
                    for i, t in enumerate(self.times_s)]
            meta = json.dumps({**self.meta, "step_s": self.step_s})
            path.write_text("\n".join([f"# {meta}", header, *rows]) + "\n")
        else:
            path.write_text(json.dumps({"kind": "diurnal_trace", "step_s": self.step_s,
                                        "times_s": self.times_s.tolist(),
                                        "qps": {m: v.tolist() for m, v in self.qps.items()}, "meta": self.meta},
                                       indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> DiurnalTrace:
        path = Path(path)
        if not path.exists():
            raise WorkloadError(f"{path}: no such file")
        try:
            return _load_csv(path) if path.suffix == ".csv" else _load_json(path)
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            raise WorkloadError(f"{path}: not a diurnal trace ({exc})") from None


def _load_json(path: Path) -> DiurnalTrace:
    data = json.loads(path.read_text())
    return DiurnalTrace(float(data["step_s"]), data["times_s"], data["qps"], data.get("meta", {}))


def _load_csv(path: Path) -> DiurnalTrace:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    meta = json.loads(lines[0][1:]) if lines and lines[0].startswith("#") else {}
    body = [ln for ln in lines if not ln.startswith("#")]
    header = body[0].split(",")
    if header[0] != "time_s" or len(header) < 2:
        raise ValueError("first column must be time_s followed by one column per model")
    data = np.array([[float(x) for x in ln.split(",")] for ln in body[1:]], ndmin=2)
    times = data[:, 0]
    step = float(meta.pop("step_s", times[1] - times[0] if len(times) > 1 else 0))
    return DiurnalTrace(step, times, {m: data[:, i + 1] for i, m in enumerate(header[1:])}, meta)


def diurnal_shape(t_s: np.ndarray, peak_valley_ratio: float = 2.0, peak_hour: float = 20.0,
                  sharpness: float = 1.0) -> np.ndarray:
    """Noiseless load relative to the peak (1 at ``peak_hour``, 1/ratio at the valley 12 h later)."""
    if not peak_valley_ratio >= 1:
        raise WorkloadError(f"peak/valley ratio must be >= 1, got {peak_valley_ratio}")
    if not sharpness > 0:
        raise WorkloadError(f"sharpness must be > 0, got {sharpness}")
    phase = 2 * np.pi * (np.asarray(t_s, dtype=float) - peak_hour * 3600.0) / DAY_S
    s = ((1 + np.cos(phase)) / 2) ** sharpness
    valley = 1.0 / peak_valley_ratio
    return valley + (1 - valley) * s


def diurnal_trace(peak_qps: float | dict[str, float], hours: float = 24.0, step_min: float = 15.0,
                  peak_valley_ratio: float = 2.0, peak_hour: float = 20.0, sharpness: float = 1.0,
                  noise: float = 0.03, seed: RngLike = 0, model: str = "model") -> DiurnalTrace:
    """A synchronous diurnal trace; ``peak_qps`` is one number (one series named ``model``) or a mapping
    model → peak QPS.  Steps start at 0, ``step_min`` apart, covering ``hours``."""
    peaks = dict(peak_qps) if isinstance(peak_qps, dict) else {model: float(peak_qps)}
    if not peaks or any(not (v >= 0 and np.isfinite(v)) for v in peaks.values()):
        raise WorkloadError(f"peak QPS must be >= 0 for every model, got {peaks}")
    if not hours > 0 or not step_min > 0 or step_min > hours * 60:
        raise WorkloadError(f"need 0 < step ({step_min} min) <= duration ({hours} h)")
    if not noise >= 0:
        raise WorkloadError(f"noise must be >= 0, got {noise}")
    step_s = step_min * 60.0
    times = np.arange(0.0, hours * 3600.0 - 1e-9, step_s)
    shape = diurnal_shape(times + step_s / 2, peak_valley_ratio, peak_hour, sharpness)  # mid-step rate
    rng = as_rng(seed)
    qps = {}
    for name, peak in peaks.items():
        eps = rng.standard_normal(times.size)
        qps[name] = np.clip(peak * shape * (1 + noise * eps), 0.0, None)
    meta = {"peak_qps": peaks, "peak_valley_ratio": peak_valley_ratio, "peak_hour": peak_hour,
            "sharpness": sharpness, "noise": noise, "seed": seed if isinstance(seed, int) else None,
            "step_min": step_min, "hours": hours}
    return DiurnalTrace(step_s, times, qps, meta)
