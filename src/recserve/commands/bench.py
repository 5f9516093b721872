"""``recserve bench``: open-loop Poisson load against a node server (HTTP/gRPC) or a model in-process.

One run at ``--rate``, or ``--find-max-load``: the latency-bounded QPS under the SLA percentile, or
``--tune-offload K1,K2,...``: that search with each accelerator threshold ``min_items`` set on a live node
(DeepRecSys' offload threshold found by measurement), the best one left set.
Latency is counted from each query's scheduled send time (no coordinated omission).  A run that gets no answer
with scores, or whose failed queries are more than half of those measured, says so and exits with status 1 (a
script's check that the server is up and serving).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from collections.abc import Iterator

from recserve.commands._plan_common import (
    count,
    growth,
    int_list,
    non_negative,
    number,
    percentile,
    positive,
    qps,
    seed,
)
from recserve.errors import RecserveError
from recserve.jsonio import write_text_atomic
from recserve.specs import get_model


def _run(args: argparse.Namespace) -> int:
    spec = get_model(args.model)
    if args.scale is None:  # a repository model is served as its files hold it: unscaled
        from recserve.serving.node.repository import is_reference

        args.scale = 1.0 if is_reference(args.model) else 1e-3
    sla_ms = args.sla_ms or spec.sla.target_ms
    percentile = args.percentile or spec.sla.percentile
    stack = contextlib.ExitStack()
    with stack:
        if args.target in ("serve-http", "serve-grpc"):
            from recserve.measure.served import LocalServer

            server = stack.enter_context(LocalServer(spec.name, args.scale, workers=args.workers))
            target = server.target(args.target.removeprefix("serve-"), timeout_s=args.timeout_ms / 1000.0)
            before_run = server.wait_idle
        else:
            from recserve.measure.targets import make_target

            target = make_target(args.target, args.served_name or args.model, workers=args.workers,
                                 timeout_s=args.timeout_ms / 1000.0)
            before_run = None
        return _bench(args, spec, target, sla_ms, percentile, before_run)


def _bench(args: argparse.Namespace, spec, target, sla_ms: float, percentile: float, before_run=None) -> int:
    """Send the load ``args`` ask for; save ``--json`` then ``--plot``.  Ctrl-C or SIGTERM saves what completed,
    marked ``interrupted``, and then stops the command as the signal does."""
    # the load generator imports torch (its request pools build zoo batches): only when a command sends load, so
    # every other command of the CLI starts without it
    from recserve.measure.loadgen import LoadSession, RunInterrupted
    from recserve.measure.maxload import SearchInterrupted
    from recserve.measure.requests import RequestPool

    pool = RequestPool.from_mix(spec, args.scale, args.sizes, pool=args.pool, seed=args.seed, index=args.index)
    print(f"[bench] {target.name}: model {spec.name} at scale {args.scale:g}, sizes {args.sizes} "
          f"(pool of {len(pool)}, mean {pool.mean_size:.0f} items), indices {args.index}", file=sys.stderr)
    run_kwargs = dict(max_requests=args.requests, max_inflight=args.max_inflight, timeout_s=args.timeout_ms / 1000.0,
                      warmup_s=args.warmup, progress=not args.quiet, integer_ms=args.integer_ms_gaps)
    measured = Measured(args, spec, target, sla_ms, percentile)
    try:
        with LoadSession(target, pool, warm=not args.no_warmup, before_run=before_run, procs=args.procs,
                         spin_ms=args.spin_ms) as session:
            if args.tune_offload:
                measured.out = _tune_offload(args, spec, target, session, sla_ms, percentile, run_kwargs)
            elif args.find_max_load:
                print(f"[bench] max-load search: p{percentile:g} <= {sla_ms:g} ms, start {args.rate:g} qps, "
                      f"x{args.growth:g} then bisect to {args.rtol:.0%}", file=sys.stderr)
                measured.search(_max_load(args, session, sla_ms, percentile, run_kwargs, itertools.count(args.seed)))
            elif args.sweep:
                measured.sweep(_sweep(args, session, sla_ms, percentile, run_kwargs))
            else:
                measured.run(session.run(args.rate, args.duration, seed=args.seed, **run_kwargs))
    except (RunInterrupted, SearchInterrupted) as exc:
        measured.interrupted(exc.result)
        _save(args, measured)
        raise exc.signal from None
    _save(args, measured)
    return measured.failed


MAX_FAILED_SHARE = 0.5  # a single run with more of its measured queries failed than this exits with status 1


class Measured:
    """What one ``bench`` command measured, as printed lines, its ``--json`` record and its ``--plot`` figure."""

    def __init__(self, args: argparse.Namespace, spec, target, sla_ms: float, percentile: float) -> None:
        self.args, self.spec, self.target, self.sla_ms, self.percentile = args, spec, target, sla_ms, percentile
        self.out: dict | None = None
        self.draw = None  # a function of the plot path, or None
        self.failed = 0  # the exit status: 1 when a single run got no answer with scores

    def _head(self, kind: str) -> dict:
        return {"kind": kind, "model": self.spec.name, "scale": self.args.scale, "target": self.target.name,
                "sizes": self.args.sizes, "index": self.args.index}

    def search(self, result, kind: str = "max_load", interrupted: bool = False) -> None:
        """A max-load search (or a sweep's curve): its line, record and latency-vs-load figure."""
        from recserve.measure.maxload import refusal_bound
        from recserve.measure.plot import plot_latency_vs_load

        p, limited = self.percentile, refusal_bound(result)
        if kind == "max_load":
            bound = ">=" if interrupted else ""
            print(f"max load {bound}{result.max_qps:.2f} qps at p{p:g} <= {self.sla_ms:g} ms "
                  f"(bracket {result.bracket[0]:.2f}..{result.bracket[1]:.2f}, {len(result.probes)} probes, "
                  f"{result.reason})" + (f"; {limited}" if limited else ""))
        self.out = {**self._head(kind), **result.to_dict(), **({"interrupted": True} if interrupted else {}),
                    **({"limited_by": "refusals", "limited_note": limited} if limited else {})}
        self.draw = lambda path: plot_latency_vs_load(result, path, f"{self.spec.name} via {self.target.name}")

    def sweep(self, curve) -> None:
        self.search(curve, "sweep")

    def run(self, result, interrupted: bool = False) -> None:
        """One run: its summary, the server's refusal reasons, and a status of 1 if nothing was answered."""
        from recserve.measure.plot import plot_run

        print(result.summary())
        if result.refusal_reasons:  # the server's own words for what it refused or failed: what to change
            print(f"[bench] {server_answers(result.errors)}: " + "; ".join(
                f"{reason} (x{n})" for reason, n in sorted(result.refusal_reasons.items(), key=lambda kv: -kv[1])),
                file=sys.stderr)
        if result.ok == 0 and not interrupted:
            self.failed = 1
            errors = ", ".join(f"{kind}={n}" for kind, n in result.errors.items())
            print(f"[bench] no query was answered with scores ({errors})" + (
                "" if result.refusal_reasons else f": is a server up at {self.args.target}, serving "
                                                  f"{self.args.served_name or self.spec.name}?"), file=sys.stderr)
        elif result.failed > MAX_FAILED_SHARE * result.measured and not interrupted:
            self.failed = 1
            print(f"[bench] most queries failed ({result.failed} of {result.measured}): exit status 1",
                  file=sys.stderr)
        self.out = {"kind": "load_run", "model": self.spec.name, "scale": self.args.scale, "sizes": self.args.sizes,
                    "index": self.args.index, "sla_ms": self.sla_ms, "percentile": self.percentile,
                    "meets_sla": result.percentile(self.percentile) <= self.sla_ms, **result.to_dict(),
                    **({"interrupted": True} if interrupted else {})}
        self.draw = lambda path: plot_run(result, path, f"{self.spec.name} via {self.target.name} at "
                                                        f"{self.args.rate:g} qps")

    def interrupted(self, result) -> None:
        """What completed before Ctrl-C or SIGTERM, printed and recorded as ``interrupted``."""
        from recserve.measure.maxload import MaxLoadResult

        if result is None:
            print("[bench] interrupted before any query completed: nothing to save", file=sys.stderr)
        elif isinstance(result, MaxLoadResult):
            self.search(result, "sweep" if self.args.sweep else "max_load", interrupted=True)
        else:
            self.run(result, interrupted=True)


SERVER_ERROR_CODES = ("grpc_INTERNAL", "grpc_UNKNOWN", "grpc_DATA_LOSS", "grpc_UNIMPLEMENTED")


def server_answers(errors: dict[str, int]) -> str:
    """What the server's error answers were: refusals (it turned the query away: overloaded, past its deadline,
    a bad request), server errors (it failed: HTTP 5xx other than 503/504, gRPC INTERNAL and kin), or both."""
    from recserve.measure.maxload import REFUSAL_KINDS

    kinds = [k for k in errors if k.startswith(("http_", "grpc_"))]
    broken = [k for k in kinds if k in SERVER_ERROR_CODES or (k.startswith("http_5") and k not in REFUSAL_KINDS)]
    refused = [k for k in kinds if k not in broken]
    return {(True, False): "the server refused queries", (False, True): "the server failed queries with server errors",
            (True, True): "the server refused queries or failed them with server errors"}.get(
        (bool(refused), bool(broken)), "the server answered queries with errors")


def _save(args: argparse.Namespace, measured: Measured) -> None:
    """``--json`` first (atomically), then ``--plot``: a figure that cannot be drawn does not cost the numbers."""
    if measured.out is None:
        return
    if args.json:
        write_text_atomic(args.json, json.dumps(measured.out, indent=1))
        print(f"[bench] wrote {args.json}", file=sys.stderr)
    if args.plot and measured.draw is not None:
        measured.draw(args.plot)
        print(f"[bench] wrote {args.plot}", file=sys.stderr)


def _max_load(args: argparse.Namespace, session, sla_ms: float, percentile: float, run_kwargs: dict,
              probe_seed: Iterator[int]):
    """``--find-max-load``'s search: each probe a run of ``--duration`` at its rate with the next seed, after
    checking queries sent one at a time meet the SLA (else max load 0 at once, as ``profile host`` does)."""
    from recserve.measure.maxload import find_max_load, stderr_log, unloaded_miss

    missed = unloaded_miss(session.unloaded_latency_ms(), sla_ms, percentile)
    if missed is not None:
        stderr_log(f"[bench] {missed.reason} {sla_ms:g} ms with each pooled query sent alone: no rate can meet it")
        return missed
    return find_max_load(
        lambda rate: session.run(rate, args.duration, seed=next(probe_seed), min_requests=args.min_requests,
                                 **run_kwargs),
        sla_ms, percentile, start_qps=args.rate, growth=args.growth, rtol=args.rtol,
        max_qps=args.max_qps, max_probes=args.max_probes, log=stderr_log,
    )


def _tune_offload(args: argparse.Namespace, spec, target, session, sla_ms: float, percentile: float,
                  run_kwargs: dict) -> dict:
    """The max load with each ``--tune-offload`` threshold set through the node's control API; the best stays set."""
    from recserve.measure.offload import tune_offload
    from recserve.serving.node.control_client import ControlClient, ControlError

    if not args.target.startswith("http"):
        raise RecserveError("--tune-offload needs --target http://HOST:PORT of a node whose model has accelerator "
                            "workers (it sets their threshold through the control API)")
    control, name = ControlClient.from_url(args.target), args.served_name or args.model
    probe_seed = itertools.count(args.seed)  # one sequence over every threshold's probes

    def set_threshold(k: int) -> None:
        try:
            control.set_min_items(name, k)
        except ControlError as exc:
            raise RecserveError(f"--tune-offload: the node refused min_items {k} for {name!r}: {exc}") from exc

    best, results = tune_offload(set_threshold,
                                 lambda _k: _max_load(args, session, sla_ms, percentile, run_kwargs, probe_seed),
                                 args.tune_offload,
                                 log=lambda m: print(f"[bench] {m}", file=sys.stderr))
    print(f"max load at p{percentile:g} <= {sla_ms:g} ms by offload threshold (queries of >= min_items items go to "
          "the accelerator workers):")
    for r in results:
        mark = "  <- best, left set" if r is best else ""
        print(f"  min_items {r.min_items:6d}: {r.search.max_qps:10.2f} qps{mark}")
    return {"kind": "offload_threshold", "model": spec.name, "scale": args.scale, "target": target.name,
            "sizes": args.sizes, "sla_ms": sla_ms, "percentile": percentile, "best_min_items": best.min_items,
            "results": [r.to_dict() for r in results]}


def _sweep(args: argparse.Namespace, session, sla_ms: float, percentile: float, run_kwargs: dict):
    """One run per rate in ``--sweep``: the latency-vs-load curve without a search."""
    from recserve.measure.maxload import MaxLoadResult, Probe, SearchInterrupted

    probes = []

    def curve(reason: str) -> MaxLoadResult:
        best = max((p.rate for p in probes if p.ok), default=0.0)
        return MaxLoadResult(best, sla_ms, percentile, list(probes), (best, float("inf")), False, reason)

    for k, rate in enumerate(args.sweep):
        try:
            result = session.run(rate, args.duration, seed=args.seed + k, **run_kwargs)
        except KeyboardInterrupt as exc:
            raise SearchInterrupted(curve(f"interrupted after {len(probes)} rate(s)"),
                                    getattr(exc, "signal", exc)) from exc
        latency = result.percentile(percentile)
        probes.append(Probe(rate, latency, latency <= sla_ms, result.to_dict()))
        print(f"{rate:10.2f} qps: {result.summary()}")
    done = curve("sweep")
    print(f"highest swept rate meeting p{percentile:g} <= {sla_ms:g} ms: {done.max_qps:g} qps")
    return done


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--sweep needs comma-separated rates, got {text!r}") from exc
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError("--sweep rates must be > 0")
    return rates


def _check(args: argparse.Namespace) -> None:
    if args.rate <= 0:
        raise RecserveError("--rate must be > 0")
    if args.duration == 0:
        args.duration = None
    if args.duration is None and args.requests is None:
        raise RecserveError("give --duration or --requests (or both) to bound the run")
    if args.warmup < 0 or (args.duration is not None and args.warmup >= args.duration):
        raise RecserveError(f"--warmup must be >= 0 and under --duration ({args.duration:g} s), got {args.warmup:g}"
                            if args.duration is not None else f"--warmup must be >= 0, got {args.warmup:g}")
    if args.max_inflight < 1 or args.pool < 1 or args.procs < 1 or args.timeout_ms <= 0 or args.spin_ms < 0:
        raise RecserveError("--max-inflight, --pool and --procs must be >= 1, --timeout-ms > 0, --spin-ms >= 0")


def cmd_bench(args: argparse.Namespace) -> int:
    _check(args)  # --json and --plot: checked writable before any command runs (``cli._check_outputs``)
    return _run(args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="open-loop Poisson load: latency percentiles and max load (latency-bounded QPS)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for add in (_add_target_options, _add_load_options, _add_search_options, _add_output_options):
        add(p)
    p.set_defaults(func=cmd_bench)


def _add_target_options(p: argparse.ArgumentParser) -> None:
    """What is measured: the model, the server (or in-process pool) and its workers."""
    p.add_argument("--model", required=True, help="catalogue model (queries are built to fit it)")
    p.add_argument("--target", default="inprocess",
                   help="http://HOST:PORT, http+json://HOST:PORT (plain JSON), http+shm://HOST:PORT (queries in "
                        "shared memory, a node on this host), grpc://HOST:PORT, inprocess (process pool), "
                        "inprocess:thread, or "
                        "serve-http / serve-grpc (start a local node server with --workers workers)")
    p.add_argument("--served-name", default="", help="model name on the server (default: --model)")
    p.add_argument("--scale", type=number(0, 1, low_open=True), default=None,
                   help="table-row scale the server/model was built with (default 1e-3 for a catalogue model, 1 for "
                        "a repository model's path)")
    p.add_argument("--workers", type=count, default=1,
                   help="workers for inprocess and serve-* targets (ignored for remote servers)")


def _add_load_options(p: argparse.ArgumentParser) -> None:
    """The offered load: rate, length, query sizes and skew, the generator's limits and seeds."""
    p.add_argument("--rate", type=qps, default=10.0, help="offered queries/s (start rate with --find-max-load)")
    p.add_argument("--duration", type=non_negative, default=10.0,
                   help="seconds per run (0 = bounded by --requests only)")
    p.add_argument("--requests", type=count, default=None, help="at most this many queries per run")
    p.add_argument("--sizes", default="production",
                   help="query-size mix (recserve.workload): production, fixed:N, lognormal:mu=5.1,sigma=0.2, "
                        "normal:mean=256,sd=32, file:PATH")
    p.add_argument("--index", default="uniform",
                   help="embedding-index skew (recserve.workload): uniform, locality:p=0.9, zipf:alpha=1.05")
    p.add_argument("--integer-ms-gaps", action="store_true",
                   help="DeepRecSys-style integer-millisecond Poisson gaps instead of exponential gaps")
    p.add_argument("--pool", type=count, default=32, help="distinct pre-built queries (mix quantiles)")
    p.add_argument("--max-inflight", type=count, default=512, help="queries in flight at most; more are dropped")
    p.add_argument("--timeout-ms", type=positive, default=10_000.0,
                   help="how long the client waits for an answer (sent to the server as no deadline: over HTTP "
                        "and gRPC alike, a node applies its own deadline_ms)")
    p.add_argument("--procs", type=count, default=1,
                   help="load-generator processes sharing the Poisson schedule (http/grpc/serve-* targets)")
    p.add_argument("--spin-ms", type=non_negative, default=0.0,
                   help="yield instead of sleeping for the last MS before each send: sub-ms send lag, more CPU")
    p.add_argument("--warmup", type=float, default=0.0, help="seconds at the start not counted")
    p.add_argument("--seed", type=seed, default=0, help="seed of the queries and arrivals (default 0)")
    p.add_argument("--no-warmup", action="store_true", help="skip sending every pooled query once before timing")


def _add_search_options(p: argparse.ArgumentParser) -> None:
    """What to find: a max-load search (its SLA, steps and budget), a sweep or the best offload threshold."""
    p.add_argument("--find-max-load", action="store_true", help="search the highest rate meeting the SLA")
    p.add_argument("--sweep", type=_rates, default=None, metavar="R1,R2,...",
                   help="one run per rate (latency-vs-load curve, plotted with --plot) instead of a search")
    p.add_argument("--tune-offload", type=int_list, default=None, metavar="K1,K2,...",
                   help="on a node with accelerator workers: max load with each offload threshold min_items (set "
                        "through its control API), the best left set")
    p.add_argument("--sla-ms", type=positive, default=None, help="SLA target (default: the model's)")
    p.add_argument("--percentile", type=percentile, default=None, help="SLA percentile (default: the model's)")
    p.add_argument("--growth", type=growth, default=2.0, help="rate multiplier while no probe violates")
    p.add_argument("--rtol", type=float, default=0.05, help="bisect until the bracket is this fraction wide")
    p.add_argument("--max-qps", type=float, default=1e5, help="highest rate a max-load search tries (QPS)")
    p.add_argument("--max-probes", type=count, default=30, help="most probes one max-load search runs")
    p.add_argument("--min-requests", type=count, default=50,
                   help="each max-load probe sends at least this many queries (low rates run longer)")


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """Where the result goes, and the progress line."""
    p.add_argument("--json", default=None, help="write the result as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG (latency vs load, or the run's latency CDF)")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
