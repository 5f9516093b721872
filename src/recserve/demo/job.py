"""The demo job's steps: each named, timed and isolated (a failed step is reported and the demo goes on), from
profiling this host through the plans to the live runs, then the report and the terminal summary."""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recserve import report
from recserve.cli import main as cli
from recserve.demo.capacity import measured_capacity
from recserve.demo.live import LIVE_CONTROLLERS, live_stem, run_live, strict_json
from recserve.demo.load import LIVE_MODELS, LIVE_PEAKS
from recserve.demo.pages import plot_live, render_demo, render_live
from recserve.errors import RecserveError

# Hercules' heterogeneous cluster (counts are ours: the paper gives the types, not a fleet) and a day of load
HERCULES_DAY = """available: {hercules-t1: 40, hercules-t2: 40, hercules-t3: 20, hercules-t4: 20, hercules-t5: 10,
            hercules-t6: 10, hercules-t7: 10, hercules-t8: 10, hercules-t9: 10, hercules-t10: 10}
peak_qps: {hercules-rmc1: 20000, hercules-rmc2: 3000, hercules-rmc3: 5000, hercules-din: 2000}
"""
HERA_MODELS = ("hera-dlrm-a", "hera-dlrm-b", "hera-dlrm-c", "hera-dlrm-d", "hera-ncf", "hera-dien", "hera-din",
               "hera-wnd")


@dataclass
class Step:
    name: str
    seconds: float = 0.0
    ok: bool = False
    summary: str = ""
    outputs: list[str] = field(default_factory=list)
    error: str = ""


class DemoRun:
    """Runs named steps with timing, progress lines and failure isolation."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.steps: list[Step] = []
        self.started = time.monotonic()

    def path(self, name: str) -> Path:
        return self.out / name

    def step(self, name: str, fn: Callable[[Step], None]) -> Step:
        step = Step(name)
        self.steps.append(step)
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:6.1f}s] {name} ...", file=sys.stderr, flush=True)
        start = time.monotonic()
        try:
            fn(step)
            step.ok = True
        except Exception as exc:  # noqa: BLE001 - a failed step is reported, the demo goes on
            step.error = f"{type(exc).__name__}: {exc}"
            traceback.print_exc(file=sys.stderr)
        step.seconds = time.monotonic() - start
        mark = "ok" if step.ok else f"FAILED ({step.error})"
        print(f"[{time.monotonic() - self.started:6.1f}s] {name}: {mark} {step.summary}", file=sys.stderr, flush=True)
        return step

    def cli(self, step: Step, args: list[str], outputs: list[Path]) -> None:
        code = cli(args)
        if code != 0:
            raise RecserveError(f"`recserve {' '.join(args)}` exited with {code}")
        step.outputs += [str(p) for p in outputs if p.exists()]


# ------------------------------------------------------------------------------ steps


def profile_step(run: DemoRun, scale: float, quick: bool) -> Callable[[Step], None]:
    def go(step: Step) -> None:
        measured = run.path("profiles/this-host.json")
        args = ["profile", "host", "--models", ",".join(LIVE_MODELS), "--scale", str(scale), "--via", "inprocess",
                "--batches", "1,16,64,256,1024", "--workers", "1,2", "--out", str(measured)]
        run.cli(step, args + (["--quick"] if quick else []), [measured])
        calibration = run.path("profiles/calibration.json")
        run.cli(step, ["profile", "calibrate", "--measured", str(measured), "--out", str(calibration)], [calibration])
        from recserve.profiles import ProfileSet

        tables = ProfileSet.load(measured)
        maxload = {t.model: t.interp(1, "max_qps") for t in tables.find(kind="maxload_vs_workers")}
        step.summary = "max load, 1 worker: " + ", ".join(f"{m} {q:.1f} QPS" for m, q in maxload.items())
    return go


def plan_steps(run: DemoRun) -> list[tuple[str, Callable[[Step], None]]]:
    calibration = run.path("profiles/calibration.json")

    def colocate(step: Step) -> None:
        out, png = run.path("plans/colocate.json"), run.path("plans/colocate.png")
        run.cli(step, ["plan", "colocate", "--server", "hera-xeon", "--models", ",".join(HERA_MODELS), "--level", "4",
                       "--json", str(out), "--plot", str(png)], [out, png])
        step.summary = _plan_summary(out)

    def pool(step: Step) -> None:
        out, png = run.path("plans/pool.json"), run.path("plans/pool.png")
        run.cli(step, ["plan", "pool", "--reference", "kairos", "--json", str(out), "--plot", str(png)], [out, png])
        step.summary = _plan_summary(out)

    def provision(step: Step) -> None:
        traffic = run.path("plans/day.yaml")
        traffic.parent.mkdir(parents=True, exist_ok=True)
        traffic.write_text(HERCULES_DAY)
        out, png = run.path("plans/provision.json"), run.path("plans/provision.png")
        run.cli(step, ["plan", "provision", "--traffic", str(traffic), "--steps", "24", "--json", str(out),
                       "--plot", str(png)], [traffic, out, png])
        step.summary = _plan_summary(out)

    def dispatch(step: Step) -> None:
        out, png = run.path("plans/dispatch.json"), run.path("plans/dispatch.png")
        run.cli(step, ["simulate", "dispatch", "--reference", "kairos", "--model", "rm2", "--queries", "4000",
                       "--json-out", str(out), "--plot", str(png)], [out, png])
        step.summary = _plan_summary(out)

    def shard(step: Step) -> None:
        out, png = run.path("plans/shard.json"), run.path("plans/shard.png")
        run.cli(step, ["plan", "shard", "--model", "elasticrec-rm1", "--qps", "3000", "--grid", "128",
                       "--json", str(out), "--plot", str(png)], [out, png])
        step.summary = f"{json.loads(out.read_text())['saving_vs_modelwise']:.2f}x less memory than model-wise"

    def tier(step: Step) -> None:
        out = run.path("plans/tier.json")
        run.cli(step, ["plan", "tier", "--model", "sdm-m1", "--dram-gb", "64", "--qps", "200", "--out", str(out)],
                [out])
        step.summary = _plan_summary(out)

    del calibration  # the planners use the bundled constants; the calibration feeds the live capacity
    return [("plan: Hera co-location (8 Hera models, hera-xeon)", colocate),
            ("plan: Kairos pool ($2.5/hr, AWS reference latencies)", pool),
            ("plan: Hercules provisioning over a day", provision),
            ("simulate: Kairos dispatch vs Ribbon/DRS/Clockwork/Oracle", dispatch),
            ("plan: ElasticRec shards for RM1", shard),
            ("plan: SDM tiering for M1", tier)]


def _plan_summary(path: Path) -> str:
    """One line of headline numbers from a plan or simulation JSON (by its ``kind``)."""
    data = json.loads(path.read_text())
    s, b = data.get("summary", {}), data.get("baselines", {})
    kind = data.get("kind")
    if kind == "colocate":
        pairs = ("no co-located pairs" if s.get("min_pair_emu") is None
                 else f"chosen pairs' EMU {s['min_pair_emu']:.2f}-{s['max_pair_emu']:.2f}")
        return (f"Hera {s['servers']:.0f} servers vs DeepRecSys {b['deeprecsys']['servers']:.0f}, "
                f"Random {b['random']['servers']:.1f}; {pairs}")
    if kind == "pool":
        return f"upper-bound throughput {s['mean_ub_gain_vs_homogeneous']:.2f}x the best homogeneous pool (mean of 5)"
    if kind == "provision":
        g, o = b["greedy"], b["oblivious"]
        return (f"peak provisioned power {s['peak_power_w']:,.0f} W vs greedy {g['peak_power_w']:,.0f} W, "
                f"oblivious {o['peak_power_w']:,.0f} W")
    if kind == "tier":
        return (f"{s['dram_saved_gb']:.0f} GB DRAM saved, hit rate {s['hit_rate']:.2f}, "
                f"{s['required_iops']:,.0f} IOPS of {s['ssd_iops']:,.0f}")
    if "results" in data:
        r = data["results"][0]
        qps = {k: v["max_qps"] for k, v in r["policies"].items()}
        return (f"{r['model']} on {r['pool']}: " + ", ".join(f"{k} {v:.0f}" for k, v in qps.items())
                + f" QPS; homogeneous {r['homogeneous']['max_qps']:.0f}")
    return ""


def live_step(run: DemoRun, scale: float, seconds: float, window_s: float) -> Callable[[Step], None]:
    """Measure node A's capacity now, then one run per controller in ``LIVE_CONTROLLERS`` under the same load, sent
    to node A directly: through the Kairos router (node A + a replica on node B, one slot each) the router's own
    queueing dominated the p95, so the comparison would have measured the router, not the RMU
    (docs/decisions/2026-11-28-demo-live-load-sized-live.md)."""
    def go(step: Step) -> None:
        measured = measured_capacity(run, scale, LIVE_MODELS, "fig14", LIVE_PEAKS)
        runs = {name: run_live(run, scale, seconds, window_s, name, use_router=False, shape="fig14",
                               peaks=LIVE_PEAKS, capacity=measured.profiles) for name in LIVE_CONTROLLERS}
        compared = {name: d["violation_fraction"] for name, d in runs.items()}
        for name, data in runs.items():
            data.update(measured.to_dict())
            if name == LIVE_CONTROLLERS[0]:
                data["compared"] = compared
            path = run.path(f"live/{live_stem(name)}.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(strict_json(data), indent=1, allow_nan=False))
            step.outputs += [str(path), str(plot_live(data, path.with_suffix(".png")))]
        lead = runs[LIVE_CONTROLLERS[0]]
        step.summary = (f"{len(lead['windows']) // 2} windows per model; SLA violated in "
                        + "; ".join(f"{name}: " + ", ".join(f"{m} {100 * f:.0f}%" for m, f in v.items())
                                    for name, v in compared.items())
                        + f"; {len(lead['decisions'])} RMU decisions")
    return go


def write_report(run: DemoRun) -> Path:
    summary = {"kind": "demo", "steps": [s.__dict__ for s in run.steps]}
    summary_path = run.path("demo.json")
    summary_path.write_text(json.dumps(summary, indent=1))
    sections = [render_demo(summary, run.out)]
    live = run.path("live/live.json")
    if live.exists():
        sections.append(render_live(json.loads(live.read_text()), live.parent))
    for s in run.steps:
        if s.name.startswith(("plan", "simulate")):
            images = [report.image(p) for p in s.outputs if p.endswith(".png")]
            sections.append(f"<h2>{report.esc(s.name)}</h2><p>{report.esc(s.summary)}</p>" + "".join(images))
    html_path = run.path("report.html")
    html_path.write_text(report.page("recserve demo", sections, time.strftime("%Y-%m-%d %H:%M:%S")))
    return html_path


def run_demo(out: Path, scale: float = 1e-3, live_seconds: float = 90.0, window_s: float = 3.0,
             quick: bool = True) -> int:
    out.mkdir(parents=True, exist_ok=True)
    run = DemoRun(out)
    profiled = run.step("profile two models on this host", profile_step(run, scale, quick))
    for name, fn in plan_steps(run):
        run.step(name, fn)
    if profiled.ok:
        run.step("live: node server + Hera RMU vs static, Hera Fig. 14 load",
                 live_step(run, scale, live_seconds, window_s))
    html = write_report(run)
    print_summary(run, html)
    return 0 if all(s.ok for s in run.steps) else 1


def print_summary(run: DemoRun, html: Path) -> None:
    print(f"\nrecserve demo — {time.monotonic() - run.started:.0f} s")
    for s in run.steps:
        status = "ok    " if s.ok else "FAILED"
        print(f"  {status} {s.name:58s} {s.seconds:6.1f}s  {s.summary or s.error}")
    print(f"report: {html}")
