"""PNG figures of load runs (matplotlib, Agg backend: no display needed), and :func:`pyplot`, the one way every
figure in recserve gets matplotlib: an optional dependency (the ``report`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.errors import RecserveError

if TYPE_CHECKING:
    from recserve.measure.loadgen import LoadResult
    from recserve.measure.maxload import MaxLoadResult

MISSING = "figures need matplotlib: pip install 'recserve[report]'"


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or a one-line error naming the extra that brings it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RecserveError(MISSING) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_vs_load(result: MaxLoadResult, path: str | Path, title: str = "") -> Path:
    """p50/p95/p99 latency of every probe against offered load, with the SLA and the max load."""
    plt = pyplot()
    probes = sorted(result.probes, key=lambda p: p.rate)
    rates = np.array([p.rate for p in probes])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        ys = [((p.detail.get("latency_ms") or {}).get(key)) for p in probes]
        if any(y is not None for y in ys):
            ax.plot(rates, [np.nan if y is None else y for y in ys], style, label=key, markersize=4)
    if not any(p.detail for p in probes):
        ax.plot(rates, [p.latency_ms for p in probes], "o-", label=f"p{result.percentile:g}")
    ax.axhline(result.sla_ms, color="red", ls="--", lw=1, label=f"SLA p{result.percentile:g} {result.sla_ms:g} ms")
    failed = [p.rate for p in probes if not p.ok]
    if failed:  # an infinite tail (failed queries) draws no line: each such probe is marked on the top edge
        finite = [p.latency_ms for p in probes if np.isfinite(p.latency_ms)]
        top = max([*finite, result.sla_ms]) * 1.5
        ax.plot(failed, [top] * len(failed), "x", color="red", markersize=8, label="probe violating the SLA")
    what = "highest swept rate meeting SLA" if result.reason == "sweep" else "max load"
    ax.axvline(result.max_qps, color="green", ls=":", lw=1, label=f"{what} {result.max_qps:.1f} qps")
    ax.set_xlabel("offered load (queries/s, Poisson)")
    ax.set_ylabel("latency from scheduled send (ms)")
    ax.set_yscale("log")
    ax.set_title(title or "latency vs load")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


def plot_run(result: LoadResult, path: str | Path, title: str = "") -> Path:
    """Latency CDF of one run (the tail is where SLAs live)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lat = np.sort(result.latencies_ms)
    if lat.size:
        ax.plot(lat, np.arange(1, lat.size + 1) / max(result.measured, 1), label="ok queries")
    for p, c in ((50, "gray"), (95, "orange"), (99, "red")):
        v = result.percentile(p)
        if np.isfinite(v):
            ax.axvline(v, color=c, ls="--", lw=1, label=f"p{p} {v:.1f} ms")
    ax.set_xscale("log")
    ax.set_xlabel("latency from scheduled send (ms)")
    ax.set_ylabel("fraction of queries")
    ax.set_title(title or f"{result.offered_qps:.1f} qps offered, {result.achieved_qps:.1f} achieved")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


def plot_policies_vs_load(rates: list[float], tails_ms: dict[str, list[float]], qos_ms: float, path: str | Path,
                          title: str = "", simulated_qps: dict[str, float] | None = None) -> Path:
    """Each dispatch policy's p99 at each offered rate of one ladder, the QoS line, and where the simulator put
    each policy's allowable throughput (a live/simulated comparison at a glance)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, (policy, tails) in enumerate(tails_ms.items()):
        ys = [t if t is not None and np.isfinite(t) else np.nan for t in tails]
        line, = ax.plot(rates, ys, "os^dv"[k % 5] + "-", label=f"{policy} (live p99)", markersize=5)
        if simulated_qps and policy in simulated_qps:
            ax.axvline(simulated_qps[policy], color=line.get_color(), ls=":", lw=1,
                       label=f"{policy} simulated max {simulated_qps[policy]:.0f} qps")
    ax.axhline(qos_ms, color="red", ls="--", lw=1, label=f"QoS p99 {qos_ms:g} ms")
    ax.set_xlabel("offered load (queries/s, Poisson)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.set_title(title or "dispatch policies vs load")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return save(fig, path)


def save(fig: Any, path: str | Path) -> Path:
    """``fig`` laid out and written as a PNG at ``path`` (its folder made), then closed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
