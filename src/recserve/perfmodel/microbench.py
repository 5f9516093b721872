"""Calibrate the perfmodel on a new host from microbenchmarks only (no model timing): a few minutes, one command
(``recserve profile calibrate --micro``).

Each host-measurable constant of :class:`Calibration` has a microbenchmark that exercises exactly the term it
stands for in ``ServiceTimes.call_times`` (one thread, like the model's per-core rates):

| constant | microbenchmark |
|---|---|
| ``compute_eff``, ``batch_half`` | GEMM ``[rows, 512] @ [512, 512]``, rows 1..1024: ``ce·rows/(rows+bh)`` of peak |
| ``per_op_us`` | one ATen op on a 1-element tensor |
| ``per_module_us`` | tiny ``Linear`` and ``EmbeddingBag`` module calls, less one op |
| ``lookup_ns``, ``llc_gbs_per_core`` | ``EmbeddingBag`` sums, LLC-resident table, two row widths: intercept, slope |
| ``dram_gbs_per_core`` | the same from a table 8x the LLC (random rows): slope per byte |
| ``stream_gbs_per_core`` | GEMV over a matrix larger than the LLC (``hostbench.measure_stream_gbs``) |
| ``act_gbs_per_core`` | ReLU over an activation larger than the L2, bytes read + written |
| ``feed_*`` | ``np.array`` of a list of Python ints / of numpy scalars (ids and lengths handed over as lists) |
| (transfer) ``model_module_us`` | a whole zoo model (``hera-dlrm-a``, tiny tables) at batch 1, per module called |
| ``fault_gbs_per_core`` | ReLU into a fresh 48 MB output (past glibc's 32 MiB mmap cap) less into a reused one |

The model's *form* (how the constants combine) was fitted once on model timings; only these constants move
with the host.  Every timing is the thread's CPU time (robust to other processes' slices), best of rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from recserve.perfmodel.calibration import Calibration
from recserve.specs import ServerType

GEMM_ROWS = (1, 4, 16, 64, 256, 1024)
GEMM_DIM = 512


def _best_us(fn: Callable[[], object], reps: int, rounds: int = 3) -> float:
    """Median CPU µs per call over ``reps`` calls, best of ``rounds``."""
    best = float("inf")
    for _ in range(rounds):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.thread_time_ns()
            fn()
            times.append(time.thread_time_ns() - t0)
        best = min(best, float(np.median(times)) / 1e3)
    return best


def _per_call_us(fn: Callable[[], object], inner: int, reps: int = 30) -> float:
    """µs per call of a call too short to time alone: ``inner`` calls per timed sample."""
    def many() -> None:
        for _ in range(inner):
            fn()
    return _best_us(many, reps) / inner


def gemm_efficiency(host: ServerType) -> dict[int, float]:
    import torch

    peak = host.freq_ghz * 1e9 * host.flops_per_cycle
    w = torch.rand(GEMM_DIM, GEMM_DIM)
    out = {}
    for rows in GEMM_ROWS:
        x = torch.rand(rows, GEMM_DIM)
        us = _best_us(lambda x=x: x @ w, reps=max(5, 2000 // rows))
        out[rows] = 2.0 * rows * GEMM_DIM * GEMM_DIM / (us * 1e-6) / peak
    return out


def fit_gemm(eff: dict[int, float]) -> tuple[float, float]:
    """(compute_eff, batch_half) of ``eff(rows) = ce·rows/(rows+bh)``, least squares in the linear form
    ``1/eff = 1/ce + (bh/ce)·(1/rows)``."""
    rows = np.array(list(eff), dtype=float)
    inv = 1.0 / np.array(list(eff.values()))
    slope, intercept = np.polyfit(1.0 / rows, inv, 1)
    ce = 1.0 / max(intercept, 1e-6)
    return float(ce), float(max(slope * ce, 0.1))


PLATEAU_ROWS = 256  # GEMM rows from which efficiency has saturated (what ``compute_eff`` stands for)


def gemm_plateau(micro: dict[str, Any]) -> float:
    """Fraction of the host's nominal peak (``freq_ghz · flops_per_cycle``) the GEMM microbenchmark reaches at large
    row counts (mean over rows >= ``PLATEAU_ROWS``): the host's real large-batch FLOP rate, which nominal peaks miss
    (turbo clocks, a second FMA unit, AVX-512 clock licences, L2 size)."""
    eff = {int(k): float(v) for k, v in micro["gemm_eff"].items()}
    large = [v for k, v in eff.items() if k >= PLATEAU_ROWS] or [eff[max(eff)]]
    return float(np.mean(large))


def transfer_calibration(cal: Calibration, sources: list[tuple[dict[str, Any], int]], target: dict[str, Any],
                         label: str = "") -> Calibration:
    """``cal``, fitted on model timings of the ``sources`` hosts (their microbenchmarks, with the number of points
    each contributed), carried to the ``target`` host (its microbenchmarks): ``compute_eff`` is scaled by the ratio of
    the hosts' GEMM plateaus (:func:`gemm_plateau`, geometric mean over the sources weighted by points).

    ``compute_eff`` fitted on models is the nominal-peak fraction *the models'* GEMMs reach; it is the product of what
    the host's cores reach on a large GEMM (measured by the microbenchmark, host-dependent) and what the models'
    shapes and glue keep of it (a property of the software, the same on every host).  Only the first moves with the
    host.  The other fitted constants stay: their microbenchmarks do not track the model timings across hosts
    (docs/perfmodel.md, "Transfer to another host"), except the framework overheads when every host has the in-context
    microbenchmark (:func:`model_module_us`, recorded since 2026-11-23): they scale by its ratio.
    ``fault_gbs_per_core`` and the ``feed_*`` costs are measured, never fitted: the target's microbenchmarks when it
    has them."""
    weights = np.array([max(n, 1) for _, n in sources], dtype=float)
    source = float(np.exp(np.average(np.log([gemm_plateau(m) for m, _ in sources]), weights=weights)))
    out = cal.with_values(compute_eff=cal.compute_eff * gemm_plateau(target) / source)
    if all("model_module_us" in m for m, _ in sources) and "model_module_us" in target:
        # framework time in context (model_module_us) carries the fitted overheads; recordings before it keep them
        mod = float(np.exp(np.average(np.log([m["model_module_us"] for m, _ in sources]), weights=weights)))
        ratio = float(target["model_module_us"]) / mod
        out = out.with_values(fixed_ms=cal.fixed_ms * ratio, per_op_us=cal.per_op_us * ratio,
                              per_module_us=cal.per_module_us * ratio)
    out = _measured_constants(out, target)
    return out.with_values(fitted_on=label) if label else out


def _measured_constants(cal: Calibration, micro: dict[str, Any]) -> Calibration:
    """``cal`` with the constants that are measured, never fitted (page faults, feeding ids from Python lists) set
    from ``micro`` where it has them (recordings made before a microbenchmark existed keep ``cal``'s value)."""
    values: dict[str, float] = {}
    if "fault_gbs_per_core" in micro:
        values["fault_gbs_per_core"] = float(micro["fault_gbs_per_core"])
    if "feed_pyint_ns" in micro:
        values.update({k: float(micro[k]) for k in ("feed_pyint_ns", "feed_npscalar_ns", "feed_call_us")},
                      feed_ref_ghz=float(micro["freq_ghz"]))
    return cal.with_values(**values)


def framework_overheads() -> tuple[float, float]:
    """(per_op_us, per_module_us): one ATen op on a 1-element tensor; the zoo's two module kinds (``Linear``,
    ``EmbeddingBag``) called on tiny inputs, less their one op — what a module costs beyond its arithmetic."""
    import torch

    x, row = torch.zeros(1), torch.zeros(1, 8)
    linear = torch.nn.Linear(8, 8)
    bag = torch.nn.EmbeddingBag(16, 8, mode="sum")
    ids, offsets = torch.tensor([1, 2]), torch.tensor([0])
    with torch.no_grad():
        op = _per_call_us(lambda: torch.relu(x), 200)
        modules = [_per_call_us(lambda: linear(row), 200), _per_call_us(lambda: bag(ids, offsets), 200)]
    return op, max(float(np.mean(modules)) - op, 0.01)


def gather_rates(llc_mb: float, pooling: int = 64, bags: int = 256,
                 dims: tuple[int, int] = (16, 128)) -> dict[str, float]:
    """``lookup_ns`` and the LLC / DRAM gather rates (bytes/s of rows) of ``EmbeddingBag`` sums."""
    import torch

    def ns_per_lookup(table_mb: float, dim: int) -> float:
        rows = max(1024, int(table_mb * 2**20 / (4 * dim)))
        bag = torch.nn.EmbeddingBag(rows, dim, mode="sum")
        rng = np.random.default_rng(0)
        idx = [torch.from_numpy(rng.integers(0, rows, bags * pooling)) for _ in range(4)]
        offsets = torch.arange(0, bags * pooling, pooling)
        k = [0]

        def call() -> None:
            k[0] += 1
            bag(idx[k[0] % 4], offsets)
        with torch.no_grad():
            return _best_us(call, reps=20) * 1e3 / (bags * pooling)

    small_mb, large_mb = max(0.25, llc_mb / 8), max(64.0, llc_mb * 8)
    s1, s2 = (ns_per_lookup(small_mb, d) for d in dims)
    l1, l2 = (ns_per_lookup(large_mb, d) for d in dims)
    dbytes = 4.0 * (dims[1] - dims[0])
    llc_slope = max((s2 - s1) / dbytes, 1e-4)       # ns per byte from the LLC
    dram_slope = max((l2 - l1) / dbytes, llc_slope)  # ns per byte from DRAM
    lookup = max(s1 - 4.0 * dims[0] * llc_slope, 0.01)
    return {"lookup_ns": lookup, "llc_gbs_per_core": 1.0 / llc_slope, "dram_gbs_per_core": 1.0 / dram_slope,
            "raw_ns": {"llc": [s1, s2], "dram": [l1, l2]}}


def activation_gbs(mb: float = 8.0) -> float:
    """Bytes/s of a ReLU over an activation larger than the L2 (read + write), one thread."""
    import torch

    x = torch.rand(int(mb * 2**20 / 4))
    us = _best_us(lambda: torch.nn.functional.relu(x), reps=20)
    return 2 * x.numel() * 4 / (us * 1e-6) / 1e9


IN_MODEL_PROBE = "hera-dlrm-a"  # the whole model whose per-module framework time ``model_module_us`` measures


def modules_called(name: str, scale: float) -> int:
    """``nn.Module`` calls in one forward pass of catalogue model ``name`` at table ``scale`` (at least 1)."""
    from recserve.perfmodel.cost import model_cost, scaled_spec
    from recserve.specs import get_model

    cost = model_cost(scaled_spec(get_model(name), scale))
    return max(1, cost.sparse_modules + cost.dense_modules)


def model_module_us(name: str = IN_MODEL_PROBE) -> float:
    """µs per ``nn.Module`` call of a whole zoo model at batch 1 with tiny tables: framework time *in context* (the
    model's Python, dispatcher and allocator working set), which the isolated op/module microbenchmarks miss (on the
    dev host 22 µs per module for four catalogue models vs 11 µs for an isolated ``Linear``/``EmbeddingBag`` call)."""
    import torch

    from recserve.specs import get_model
    from recserve.zoo import build, sample_batch

    model = build(get_model(name), scale=1e-6, seed=0).eval()
    rng = np.random.default_rng(0)
    queries = [sample_batch(model, 1, rng) for _ in range(8)]
    k = [0]

    def call() -> None:
        k[0] += 1
        model(queries[k[0] % len(queries)])
    with torch.no_grad():
        return _per_call_us(call, 20, reps=20) / modules_called(name, 1e-6)


def fresh_memory_gbs(mb: float = 48.0) -> float:
    """Bytes/s at which one thread faults in freshly mapped memory: a ReLU whose output (``mb``, past glibc's 32 MiB
    mmap threshold cap, so mapped and unmapped every call) is new each call, less the same ReLU into a reused output."""
    import torch

    x = torch.rand(int(mb * 2**20 / 4))
    out = torch.empty_like(x)
    fresh = _best_us(lambda: torch.relu(x), reps=5)
    reused = _best_us(lambda: torch.clamp_min(x, 0.0, out=out), reps=5)
    return x.numel() * 4 / max((fresh - reused) * 1e-6, 1e-9) / 1e9


def feed_costs(n: int = 100_000) -> dict[str, float]:
    """What a serving stack pays per call when the model's ids arrive as Python lists (``Allocation.feed ==
    "pylist"``): ns per element of ``np.array(list of Python ints)`` (ids, as ``ndarray.tolist()`` makes them) and
    of ``np.array(list of np.int32)`` (bag lengths), and µs per ``np.array`` call on a one-element list."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 500_000, n).astype(np.int32).tolist()
    lengths = [np.int32(1)] * n
    one = [1]
    pyint = _best_us(lambda: np.array(ids), reps=10) * 1e3 / n
    npscalar = _best_us(lambda: np.array(lengths), reps=10) * 1e3 / n
    call = _per_call_us(lambda: np.array(one), 200)
    return {"feed_pyint_ns": pyint, "feed_npscalar_ns": npscalar, "feed_call_us": call}


def measure_micro(host: ServerType, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every microbenchmark above on this host (one thread)."""
    import torch

    from recserve.perfmodel.hostbench import measure_stream_gbs

    say = progress or (lambda _m: None)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        say("GEMM efficiency vs rows")
        gemm = gemm_efficiency(host)
        say("framework overheads")
        op, module = framework_overheads()
        say("embedding gathers from the LLC and from DRAM")
        gather = gather_rates(host.llc_mb or 32.0)
        say("weight streaming and activations")
        stream = measure_stream_gbs(max(128.0, 4 * (host.llc_mb or 32.0)))
        act = activation_gbs()
        say("input feeding from Python lists")
        feed = feed_costs()
        say("page faults of freshly mapped memory")
        fault = fresh_memory_gbs()
        say("framework time in a whole model")
        in_model = model_module_us()
        return {**feed, "fault_gbs_per_core": fault, "model_module_us": in_model,
                "host": host.name, "freq_ghz": host.freq_ghz, "flops_per_cycle": host.flops_per_cycle,
                "llc_mb": host.llc_mb, "gemm_eff": {str(k): v for k, v in gemm.items()}, "per_op_us": op,
                "per_module_us": module, **gather, "stream_gbs_per_core": stream, "act_gbs_per_core": act,
                "seconds": time.perf_counter() - start}
    finally:
        torch.set_num_threads(previous)


def calibration_from_micro(micro: dict[str, Any], base: Calibration) -> Calibration:
    """``base`` with every host-measurable constant set from the microbenchmarks (nothing fitted to models)."""
    ce, bh = fit_gemm({int(k): float(v) for k, v in micro["gemm_eff"].items()})
    values = {"compute_eff": ce, "batch_half": bh, "per_op_us": micro["per_op_us"],
              "per_module_us": micro["per_module_us"], "lookup_ns": micro["lookup_ns"],
              "llc_gbs_per_core": micro["llc_gbs_per_core"], "dram_gbs_per_core": micro["dram_gbs_per_core"],
              "stream_gbs_per_core": micro["stream_gbs_per_core"], "act_gbs_per_core": micro["act_gbs_per_core"]}
    cal = _measured_constants(base.with_values(**values), micro)
    return cal.with_values(fitted_on=f"microbenchmarks on {micro['host']} ({micro['seconds']:.0f} s; no model timed)")
