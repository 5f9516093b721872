"""The demo's figures and report sections: a live run's plot and table, the steps' table, registered as the
``demo-live`` and ``demo`` result kinds of :mod:`recserve.report`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from recserve import report
from recserve.demo.live import LIVE_CONTROLLERS, live_stem
from recserve.measure.plot import pyplot


def plot_live(data: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for m in data["models"]:
        ws = [w for w in data["windows"] if w["model"] == m]
        t = [w["t_s"] for w in ws]
        line = axes[0].plot(t, [w["p95_ms"] for w in ws], marker=".", label=f"{m} p95")[0]
        axes[0].axhline(ws[0]["sla_ms"] if ws else 0, color=line.get_color(), ls="--", lw=1, label=f"{m} SLA")
        axes[1].plot(t, [w["offered_qps"] for w in ws], ls="--", color=line.get_color(), label=f"{m} offered")
        axes[1].plot(t, [w["achieved_qps"] for w in ws], color=line.get_color(), label=f"{m} served")
        failed = [(w["t_s"], w["errors"] / data["window_s"]) for w in ws if w.get("errors")]
        if failed:  # a window whose queries failed may have no p95 point at all
            axes[1].scatter(*zip(*failed, strict=True), marker="x", color=line.get_color(), label=f"{m} failed")
        axes[2].step(t, [w["workers"] for w in ws], where="post", color=line.get_color(), label=m)
    axes[0].set_ylabel("p95 latency (ms)")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("QPS")
    axes[2].set_ylabel("workers (node A)")
    axes[2].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[2].set_ylim(0, max((w["workers"] for w in data["windows"]), default=1) + 0.5)
    axes[2].set_xlabel("seconds into the compressed day")
    for ax in axes:
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle(f"live: {data.get('shape', 'diurnal')} load, "
                 + ("Kairos router, " if data.get("router") else "") + f"controller {data.get('controller', 'hera')}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def render_live(data: dict[str, Any], base: Path) -> str:
    rows = []
    for m in data["models"]:
        ws = [w for w in data["windows"] if w["model"] == m]
        p95 = [w["p95_ms"] for w in ws if w["p95_ms"] is not None and w["p95_ms"] == w["p95_ms"]]
        rows.append({"model": m, "windows": len(ws), "SLA ms": ws[0]["sla_ms"] if ws else "",
                     "median p95 ms": float(np.median(p95)) if p95 else float("nan"),
                     "windows violating": f"{100 * data['violation_fraction'][m]:.0f}%",
                     "peak offered QPS": data["peak_qps"][m],
                     "errors": sum(w["errors"] for w in ws)})
    decisions = sorted(({"t (s)": round(d["time_s"], 1), "model": d["model"], "action": d["action"],
                         "detail": json.dumps(d["detail"])[:100]} for d in data["decisions"] + data.get("held", [])),
                       key=lambda row: row["t (s)"])
    compared = [{"controller": name, **{m: f"{100 * f:.0f}%" for m, f in v.items()}}
                for name, v in data.get("compared", {}).items()]
    return ("<h2>Live deployment on this host</h2>" + report.table(rows)
            + (("<h3>Windows over the SLA, same load, by controller</h3>" + report.table(compared)) if compared else "")
            + report.image(base / f"{live_stem(data.get('controller', LIVE_CONTROLLERS[0]))}.png")
            + "<h3>Resource-manager decisions</h3>" + report.table(decisions))


def render_demo(data: dict[str, Any], base: Path) -> str:
    rows = [{"step": s["name"], "status": "ok" if s["ok"] else "FAILED", "seconds": round(s["seconds"], 1),
             "result": s["summary"] or s["error"]} for s in data["steps"]]
    return "<h2>Steps</h2>" + report.table(rows)


report.register("demo-live", render_live, models=list, windows=list, peak_qps=dict, violation_fraction=dict,
                decisions=list)
report.register("demo", render_demo, steps=list)
