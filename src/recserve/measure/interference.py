"""Co-location interference measured on this host, without resctrl (Hera §IV-C, measured instead of assumed).

The model under test runs in this process on one core (one intra-op thread, timed by ``time.thread_time``
so that slices other processes steal are not counted, while cache and memory stalls are); a *co-runner*
process runs on another core:

- ``occupy:MB`` touches every cache line of an MB-sized buffer in a random order, over and over: it keeps
  about that much of the shared LLC busy, so the model sees an LLC shrunk by MB (what CAT's ways do);
- ``stream`` copies a buffer much larger than the LLC (a memory-bandwidth hog; it reports its GB/s);
- ``model:NAME`` serves another catalogue model back to back (real co-location).

Each condition is bracketed by alone runs (alone, with, alone), and the slowdown is with / mean(alone).  A
table-size sweep (the model's tables scaled so their bytes span the LLC) gives the other LLC axis.  The result
is a ProfileSet (``server="this-host"``, ``source="measured"``) of kinds ``slowdown_vs_llc_occupied``,
``slowdown_vs_corunner_gbs``, ``colocated_slowdown`` and ``latency_vs_table_mb``;
``perfmodel.interference`` turns them into the co-location simulator's parameters and Hera's 3-D lookup.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recserve.errors import RecserveError
from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import ModelSpec

HOST = "this-host"

# the co-runner dies with the measuring process, however that ends (Linux prctl PR_SET_PDEATHSIG = SIGKILL)
_DIE_WITH_PARENT = """
try:
    import ctypes; ctypes.CDLL(None).prctl(1, 9)
except Exception:
    pass
"""

_OCCUPY = """
import os, sys, numpy as np
{pin}
a = np.zeros({nbytes}, dtype=np.uint8)
lines = np.random.default_rng(0).permutation(a.size // 64) * 64
open({ready!r}, "w").close()
while True:
    a[lines] += 1
"""

_STREAM = """
import os, sys, time, numpy as np
{pin}
src = np.ones({nbytes} // 8); dst = np.empty_like(src)
open({ready!r}, "w").close()
moved, start = 0, time.perf_counter()
while True:
    np.copyto(dst, src); moved += 2 * src.nbytes
    now = time.perf_counter()
    if now - start > 0.5:
        with open({report!r}, "w") as f: f.write(str(moved / (now - start) / 1e9))
        moved, start = 0, now
"""

_MODEL = """
import os, sys, numpy as np, torch
{pin}
torch.set_num_threads(1)
from recserve.specs import get_model
from recserve.zoo import build, sample_batch
m = build(get_model({name!r}), scale={scale!r}); rng = np.random.default_rng(1)
qs = [sample_batch(m, {batch}, rng) for _ in range(8)]
open({ready!r}, "w").close()
with torch.no_grad():
    i = 0
    while True:
        m(qs[i % 8]); i += 1
"""


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


class CoRunner:
    """A co-runner process on another core; a context manager that waits until it is running."""

    def __init__(self, kind: str, arg: str | float = "", core: int | None = None, scale: float = 1e-3,
                 batch: int = 64, stream_mb: float = 512.0) -> None:
        self.dir = tempfile.mkdtemp(prefix="recserve-corunner-")
        self.ready, self.report = f"{self.dir}/ready", f"{self.dir}/gbs"
        pin = _DIE_WITH_PARENT + (f"os.sched_setaffinity(0, {{{core}}})" if core is not None else "")
        if kind == "occupy":
            code = _OCCUPY.format(pin=pin, nbytes=int(float(arg) * 2**20), ready=self.ready)
        elif kind == "stream":
            code = _STREAM.format(pin=pin, nbytes=int(stream_mb * 2**20), ready=self.ready, report=self.report)
        elif kind == "model":
            code = _MODEL.format(pin=pin, name=str(arg), scale=scale, batch=batch, ready=self.ready)
        else:
            raise RecserveError(f"unknown co-runner {kind!r}")
        self.code = code
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> CoRunner:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", self.code], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not Path(self.ready).exists():
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")[-500:] if self.proc.stderr else ""
                raise RecserveError(f"co-runner exited: {err}")
            if time.monotonic() > deadline:
                self.stop()
                raise RecserveError("co-runner did not start within 120 s")
            time.sleep(0.05)
        time.sleep(0.3)  # let it reach its steady state (buffer resident, bandwidth flowing)
        return self

    def gbs(self, wait_s: float = 5.0) -> float:
        """The streaming co-runner's last reported GB/s (waits for its first report)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                return float(Path(self.report).read_text())
            except (OSError, ValueError):
                time.sleep(0.1)
        return float("nan")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self.stop()
        for name in ("ready", "gbs"):
            Path(self.dir, name).unlink(missing_ok=True)
        os.rmdir(self.dir)


class CallTimer:
    """The model under test, built once, timed per call on fresh queries (median CPU ms of one thread)."""

    def __init__(self, spec: ModelSpec, scale: float, batch: int, seed: int = 0) -> None:
        import torch

        from recserve.zoo import build, sample_batch

        torch.set_num_threads(1)
        self.model = build(spec, scale=scale, seed=seed)
        rng = np.random.default_rng(seed)
        self.queries = [sample_batch(self.model, batch, rng) for _ in range(16)]
        self.table_mb = sum(p.numel() * p.element_size() for n, p in self.model.named_parameters()
                            if "emb" in n or "table" in n) / 2**20

    def median_ms(self, seconds: float, clock: Callable[[], float] = time.thread_time) -> float:
        import torch

        with torch.no_grad():
            self.model(self.queries[0])
            return median_call_ms(self.model, self.queries, seconds, clock)


def median_call_ms(call: Callable[[Any], Any], queries: list, seconds: float,
                   clock: Callable[[], float] = time.thread_time) -> float:
    """Median ms of ``call`` over ``queries`` in turn, for ``seconds`` and at least 5 calls: the calling thread's
    CPU time by default (waits not counted), or ``clock``'s (``time.perf_counter``: wall time, which an
    op-parallel call's other threads shorten)."""
    times, start, i = [], time.perf_counter(), 0
    while time.perf_counter() - start < seconds or len(times) < 5:
        t0 = clock()
        call(queries[i % len(queries)])
        times.append((clock() - t0) * 1e3)
        i += 1
    return float(np.median(times))


def _pinned(core: int | None) -> Callable[[], None]:
    """Pin this process to ``core``; returns the undo."""
    if core is None:
        return lambda: None
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    return lambda: os.sched_setaffinity(0, before)


NOISY_SPREAD = 0.10  # alone runs this far apart make the bracket's slowdown the host's noise
FASTER_TOLERANCE = 0.02  # a co-runner "speeding up" the model past this is noise, never interference


@dataclass
class Bracket:
    alone_ms: float
    with_ms: float
    extra: float = float("nan")  # co-runner GB/s for stream
    spread: float = 0.0  # how far the two alone runs differ, as a share of their mean: this host's noise

    @property
    def slowdown(self) -> float:
        return self.with_ms / self.alone_ms

    def doubt(self) -> str:
        """Why this slowdown may be the host's noise rather than interference ("" when it looks sound)."""
        if self.spread > NOISY_SPREAD:
            return f" (the alone runs differ by {self.spread:.0%}: noise on this host; more --seconds)"
        if self.slowdown < 1 - max(self.spread, FASTER_TOLERANCE):
            return " (faster with the co-runner: noise on this host; more --seconds)"
        return ""


def corunner_is_stream(co: CoRunner) -> bool:
    return "copyto" in co.code


def bracket(timer: CallTimer, corunner: Callable[[], CoRunner], seconds: float) -> Bracket:
    """alone, with the co-runner, alone again: slowdown against the mean of the two alone runs."""
    before = timer.median_ms(seconds)
    with corunner() as co:
        during = timer.median_ms(seconds)
        gbs = co.gbs() if corunner_is_stream(co) else float("nan")
    after = timer.median_ms(seconds)
    return Bracket((before + after) / 2, during, gbs, abs(before - after) / ((before + after) / 2))


def table_scale(spec: ModelSpec, max_table_mb: float) -> float:
    """Row scale that keeps ``spec``'s tables at most ``max_table_mb`` (full size when they are smaller)."""
    return min(1.0, max_table_mb * 2**20 / max(spec.embedding_bytes, 1))


def measure_interference(specs: Sequence[ModelSpec], *, max_table_mb: float = 128.0, batch: int = 64,
                         seconds: float = 1.0,
                         llc_mb: float = 32.0, occupy_fractions: Sequence[float] = (0.25, 0.5, 1.0, 2.0),
                         table_sweep: Sequence[float] = (0.25, 1.0, 4.0), pairs: bool = True,
                         progress: Callable[[str], None] | None = None) -> ProfileSet:
    """Every interference table for ``specs`` (see module doc); one core for the model, one for the co-runner."""
    say = progress or (lambda _m: None)
    cores = _cores()
    model_core, other = (cores[0], cores[1]) if len(cores) > 1 else (None, None)
    out = ProfileSet(meta={"source": "recserve.measure.interference", "llc_mb": llc_mb, "batch": batch,
                           "seconds_per_run": seconds, "cores": cores, "load_average": os.getloadavg(),
                           "note": "slowdown = CPU ms per call with the co-runner / mean of alone before and after"})
    undo = _pinned(model_core)
    try:
        for spec in specs:
            scale = table_scale(spec, max_table_mb)
            timer = CallTimer(spec, scale, batch)
            cond = {"scale": scale, "batch": batch, "table_mb": round(timer.table_mb, 3)}
            rows = []
            for frac in occupy_fractions:
                mb = frac * llc_mb
                b = bracket(timer, lambda mb=mb: CoRunner("occupy", mb, other), seconds)
                say(f"{spec.name}: LLC occupied {mb:.0f} MB -> x{b.slowdown:.3f}{b.doubt()}")
                rows.append([mb, b.alone_ms, b.with_ms, b.slowdown])
            if rows:
                out.add(ProfileTable(spec.name, HOST, "slowdown_vs_llc_occupied",
                                     ("occupied_mb", "alone_ms", "with_ms", "slowdown"), rows, "measured", cond))
            b = bracket(timer, lambda: CoRunner("stream", "", other), seconds)
            say(f"{spec.name}: streaming co-runner at {b.extra:.1f} GB/s -> x{b.slowdown:.3f}{b.doubt()}")
            out.add(ProfileTable(spec.name, HOST, "slowdown_vs_corunner_gbs",
                                 ("corunner_gbs", "alone_ms", "with_ms", "slowdown"),
                                 [[0.0, b.alone_ms, b.alone_ms, 1.0], [b.extra, b.alone_ms, b.with_ms, b.slowdown]],
                                 "measured", cond))
            if pairs:
                for partner in specs:
                    if partner.name == spec.name:
                        continue
                    b = bracket(timer, lambda p=partner: CoRunner("model", p.name, other,
                                                                  table_scale(p, max_table_mb), batch), seconds)
                    say(f"{spec.name} with {partner.name} -> x{b.slowdown:.3f}{b.doubt()}")
                    out.add(ProfileTable(spec.name, HOST, "colocated_slowdown", ("alone_ms", "with_ms", "slowdown"),
                                         [[b.alone_ms, b.with_ms, b.slowdown]], "measured",
                                         {**cond, "with": partner.name}))
            if table_sweep:
                out.add(_table_sweep(spec, spec.embedding_bytes / 2**20, llc_mb, table_sweep, batch, seconds, say))
    finally:
        undo()
    return out


def _table_sweep(spec: ModelSpec, full_table_mb: float, llc_mb: float, multiples: Sequence[float], batch: int,
                 seconds: float, say: Callable[[str], None]) -> ProfileTable:
    rows = []
    for mult in multiples:
        scale = min(1.0, mult * llc_mb / max(full_table_mb, 1e-9))
        timer = CallTimer(spec, scale, batch)
        ms = timer.median_ms(seconds)
        say(f"{spec.name}: tables {timer.table_mb:.1f} MB -> {ms:.3f} ms")
        rows.append([timer.table_mb, ms])
    return ProfileTable(spec.name, HOST, "latency_vs_table_mb", ("table_mb", "mean_ms"), rows, "measured",
                        {"batch": batch})


def summary_lines(profiles: ProfileSet) -> list[str]:
    lines = []
    for t in profiles.find(kind="slowdown_vs_llc_occupied"):
        pts = ", ".join(f"{r[0]:.0f} MB x{r[3]:.3f}" for r in t.rows)
        lines.append(f"{t.model}: LLC occupied {pts}")
    for t in profiles.find(kind="slowdown_vs_corunner_gbs"):
        lines.append(f"{t.model}: streaming co-runner {t.rows[-1][0]:.1f} GB/s x{t.rows[-1][3]:.3f}")
    for t in profiles.find(kind="colocated_slowdown"):
        lines.append(f"{t.model} with {t.conditions['with']}: x{t.rows[0][2]:.3f}")
    for t in profiles.find(kind="latency_vs_table_mb"):
        lines.append(f"{t.model}: " + ", ".join(f"{r[0]:.1f} MB {r[1]:.3f} ms" for r in t.rows))
    return lines
