"""bench_peers' figure: each server's max load by protocol and worker count, one run (``--plot``, ``--replot``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

PROTOCOLS = ("HTTP binary", "HTTP JSON", "gRPC")


def protocol(name: str) -> str:
    """The protocol a server row speaks, by the peers' naming (``servers.PEERS``): ``-grpc`` raw tensor contents,
    ``-rest`` / ``-json`` plain JSON, any other the HTTP binary extension (FastAPI and Ray are driven so)."""
    return "gRPC" if name.endswith("-grpc") else "HTTP JSON" if name.endswith(("-rest", "-json")) else "HTTP binary"


def rows(results: dict) -> list[str]:
    """The servers measured, grouped by protocol (in ``PROTOCOLS``' order), in the run's order within a group."""
    names = list(dict.fromkeys(n for by_peer in results["by_workers"].values() for n in by_peer))
    return sorted(names, key=lambda n: PROTOCOLS.index(protocol(n)))


def plot_max_loads(results: dict, png: str | Path) -> Path:
    """One group of bars per server (a bar per worker count), on a log axis: the peers span three decades."""
    from recserve.measure.plot import pyplot, save

    plt = pyplot()
    names, workers = rows(results), list(results["by_workers"])
    fig, ax = plt.subplots(figsize=(8, 0.27 * len(names) * max(1, len(workers)) + 1.3))
    height = 0.8 / len(workers)
    for k, w in enumerate(workers):
        qps = np.array([results["by_workers"][w].get(n, {}).get("max_qps") or np.nan for n in names], float)
        y = np.arange(len(names)) + k * height
        bars = ax.barh(y, np.nan_to_num(qps), height, label=f"{w} worker{'s' if w != '1' else ''}")
        ax.bar_label(bars, labels=["" if np.isnan(q) else f"{q:,.0f}" if q >= 10 else f"{q:.1f}" for q in qps],
                     fontsize=7, padding=2)
    ax.set_yticks(np.arange(len(names)) + height * (len(workers) - 1) / 2)
    ax.set_yticklabels([f"{n} ({protocol(n)})" for n in names], fontsize=8)
    for label in ax.get_yticklabels():
        if label.get_text().startswith("recserve"):
            label.set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("max load (QPS, log scale)")
    ax.set_title(f"max load at p{results['percentile']:g} <= {results['sla_ms']:g} ms: {results['model']}, "
                 f"{results['mix']} mix, one run", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3, which="both")
    return save(fig, png)
