"""``recserve workload sample|trace|indices|arrivals``: generate, summarise, save and plot workloads."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from recserve.commands._plan_common import hour, number, positive, qps, seed
from recserve.measure.plot import pyplot
from recserve.workload import (
    DiurnalTrace,
    WorkloadError,
    diurnal_trace,
    index_sampler,
    measure_locality,
    query_trace,
    save_sizes,
    size_distribution,
    summarize,
)
from recserve.workload.indices import hot_rows


def _params(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise WorkloadError(f"--param expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


MAX_DRAWS = 100_000_000  # samples one command draws: 800 MB of int64, and its statistics
MAX_TRACE_STEPS = 1_000_000  # steps of one trace (a year at 1 min is 527,040)


def _positive_int(text: str) -> int:
    """A count of draws, at most ``MAX_DRAWS`` (2e9 once tried to allocate 15 GiB)."""
    try:
        value = int(float(text)) if "e" in text.lower() else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    if value > MAX_DRAWS:
        raise argparse.ArgumentTypeError(f"at most {MAX_DRAWS:,} (about {MAX_DRAWS * 8 / 1e9:.1f} GB of draws), got "
                                         f"{value:,}")
    return value


def _stats_line(stats: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:g}" for k, v in stats.items())


# ----------------------------------------------------------------- sample


def cmd_sample(args: argparse.Namespace) -> int:
    dist = size_distribution(args.dist, **_params(args.param))
    sizes = dist.sample(args.n, args.seed)
    stats = summarize(sizes)
    print(f"distribution {dist.describe()}  seed {args.seed}")
    print(_stats_line(stats))
    if args.out:
        print(f"wrote {save_sizes(args.out, sizes)}")
    if args.plot:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.hist(sizes, bins=np.arange(0, sizes.max() + 11, 10), color="tab:blue")
        for key, style in (("mean", "-"), ("median", "--"), ("p90", ":"), ("p99", "-.")):
            ax.axvline(stats[key], color="k", linestyle=style, label=f"{key} {stats[key]:g}")
        ax.set(xlabel="query size (items)", ylabel="queries", title=f"{dist.describe()}, n={args.n}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}")
    return 0


# ----------------------------------------------------------------- trace


def _peaks(text: str) -> float | dict[str, float]:
    try:
        if "=" not in text:
            return float(text)
        pairs = [(k.strip(), float(v)) for k, _, v in (p.partition("=") for p in text.split(",") if p.strip())]
    except ValueError:
        raise WorkloadError(f"--peak-qps expects a number or MODEL=QPS,MODEL=QPS, got {text!r}") from None
    twice = sorted({k for k, _ in pairs if sum(1 for other, _ in pairs if other == k) > 1})
    if twice:
        raise WorkloadError(f"--peak-qps names {twice} more than once")
    return dict(pairs)


def cmd_trace(args: argparse.Namespace) -> int:
    peaks = _peaks(args.peak_qps)
    steps = args.hours * 60 / args.step_min
    if steps > MAX_TRACE_STEPS:
        raise WorkloadError(f"--hours {args.hours:g} at --step-min {args.step_min:g} is {steps:,.0f} steps; at most "
                            f"{MAX_TRACE_STEPS:,} (a longer step, or fewer hours)")
    if args.models:
        if isinstance(peaks, dict):
            raise WorkloadError("give either --models with one --peak-qps number or MODEL=QPS pairs, not both")
        peaks = {m.strip(): peaks for m in args.models.split(",") if m.strip()}
    trace = diurnal_trace(peaks, hours=args.hours, step_min=args.step_min, peak_valley_ratio=args.ratio,
                          peak_hour=args.peak_hour, sharpness=args.sharpness, noise=args.noise, seed=args.seed)
    _print_trace(trace)
    if args.out:
        print(f"wrote {trace.save(args.out)}")
    if args.plot is not None:
        _plot_trace(trace, args.plot or str(Path(args.out).with_suffix(".png") if args.out else "trace.png"))
    return 0


def _print_trace(trace: DiurnalTrace) -> None:
    print(f"{trace.times_s.size} steps of {trace.step_s / 60:g} min; models: {', '.join(trace.models)}")
    for model, s in trace.summary().items():
        print(f"  {model}: peak {s['peak']:.1f} qps at {s['peak_hour']:.2f} h, valley {s['valley']:.1f}, "
              f"mean {s['mean']:.1f}, peak/valley {s['peak_over_valley']:.2f}")


def _plot_trace(trace: DiurnalTrace, path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    hours = trace.times_s / 3600.0
    for model, series in trace.qps.items():
        ax.step(hours, series, where="post", label=model)
    ax.set(xlabel="hour", ylabel="QPS", title="diurnal load")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def cmd_trace_show(args: argparse.Namespace) -> int:
    trace = DiurnalTrace.load(args.path)
    _print_trace(trace)
    if args.plot:
        _plot_trace(trace, args.plot)
    return 0


# ----------------------------------------------------------------- indices


def cmd_indices(args: argparse.Namespace) -> int:
    if args.zipf is not None and args.locality is not None:
        raise WorkloadError("give --locality or --zipf, not both")
    if args.zipf is not None:
        spec = f"zipf:alpha={args.zipf}"
    elif args.locality is not None:
        spec = f"locality:p={args.locality},hot_fraction={args.hot_fraction}"
    else:
        spec = "uniform"
    sampler = index_sampler(spec, hot=args.hot, seed=args.perm_seed) if spec != "uniform" else index_sampler(spec)
    rng = np.random.default_rng(args.seed)
    idx = sampler(args.rows, args.n, rng)
    measured = measure_locality(idx, args.rows, args.hot_fraction)
    hot = hot_rows(args.rows, args.hot_fraction)
    print(f"sampler {spec}  hot rows {args.hot}  rows {args.rows}  lookups {args.n}  seed {args.seed}")
    print(f"measured locality (share of lookups on the {hot} most-accessed rows): {measured:.4f}")
    if hasattr(sampler, "row_rank"):
        in_hot_set = float(np.mean(sampler.row_rank(idx, args.rows) < hot))
        print(f"share of lookups on the generator's hot set: {in_hot_set:.4f}")
    print(f"distinct rows touched: {np.unique(idx).size}")
    if args.n < 10 * args.rows:
        print("note: fewer than 10 lookups per row; the most-accessed ranking overstates locality",
              file=sys.stderr)
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, idx)
        print(f"wrote {path}")
    return 0


# ----------------------------------------------------------------- arrivals


def cmd_arrivals(args: argparse.Namespace) -> int:
    dist = size_distribution(args.dist, **_params(args.param))
    trace = query_trace(args.qps, args.n, dist, seed=args.seed, integer_ms=args.integer_ms)
    gaps = np.diff(trace.arrival_s, prepend=0.0)
    span = float(trace.arrival_s[-1])
    print(f"{args.n} queries at {args.qps:g} qps ({'integer-ms Poisson' if args.integer_ms else 'exponential'} "
          f"gaps), sizes {dist.describe()}, seed {args.seed}")
    print(f"measured rate {args.n / span:.2f} qps  gap mean {gaps.mean() * 1e3:.3f} ms  "
          f"gap cv {gaps.std() / gaps.mean():.3f}  items/s {trace.sizes.sum() / span:.1f}")
    if args.out:
        print(f"wrote {trace.save(args.out)}")
    if args.json:
        print(json.dumps({"sizes": summarize(trace.sizes), "rate_qps": args.n / span}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workload", help="query sizes, arrivals, index skew and diurnal traces")
    wsub = p.add_subparsers(dest="workload_cmd", metavar="ACTION", required=True)
    for add in (_add_sample, _add_trace, _add_trace_show, _add_indices, _add_arrivals):
        add(wsub)


def _add_sample(wsub: argparse._SubParsersAction) -> None:
    sp = wsub.add_parser("sample", help="draw query sizes and print mean/median/p90/p99")
    sp.add_argument("--dist", default="production",
                    help="production | lognormal[:mu=,sigma=] | normal[:mean=,sd=] | fixed:N | file:PATH")
    sp.add_argument("--param", action="append", metavar="KEY=VALUE", help="distribution parameter (repeatable)")
    sp.add_argument("--n", type=_positive_int, default=20000, help="queries to draw (default %(default)s)")
    sp.add_argument("--seed", type=seed, default=0, help="random seed (default %(default)s)")
    sp.add_argument("--out", help="save sizes (.npy, or text with one size per line)")
    sp.add_argument("--plot", help="save a histogram PNG")
    sp.set_defaults(func=cmd_sample)


def _add_trace(wsub: argparse._SubParsersAction) -> None:
    tp = wsub.add_parser("trace", help="a synchronous diurnal QPS trace")
    tp.add_argument("--peak-qps", required=True, help="peak QPS, or MODEL=QPS,MODEL=QPS for several models")
    tp.add_argument("--models", help="comma-separated model names sharing one --peak-qps")
    tp.add_argument("--hours", type=number(0, 24 * 366, low_open=True), default=24.0,
                    help="length of the trace in hours (default %(default)s)")
    tp.add_argument("--step-min", type=number(1 / 60, 24 * 60), default=15.0,
                    help="minutes per step, each step one QPS value (default %(default)s)")
    tp.add_argument("--ratio", type=number(1), default=2.0, help="peak/valley ratio (Hercules: ~2)")
    tp.add_argument("--peak-hour", type=hour, default=20.0, help="hour of the day of the peak (default %(default)s)")
    tp.add_argument("--sharpness", type=positive, default=1.0, help=">1 narrows the daily peak")
    tp.add_argument("--noise", type=number(0, 1), default=0.03, help="relative per-step noise (sd)")
    tp.add_argument("--seed", type=seed, default=0, help="seed of the noise (default %(default)s)")
    tp.add_argument("--out", help="save the trace (.json or .csv)")
    tp.add_argument("--plot", nargs="?", const="", metavar="PNG",
                    help="save a PNG of QPS over time (default name: --out with .png, else trace.png)")
    tp.set_defaults(func=cmd_trace)


def _add_trace_show(wsub: argparse._SubParsersAction) -> None:
    vp = wsub.add_parser("trace-show", help="summarise (and plot) a saved trace")
    vp.add_argument("path", help="a trace saved by `recserve workload trace --out` (.json or .csv)")
    vp.add_argument("--plot", metavar="PNG", help="save a PNG of QPS over time")
    vp.set_defaults(func=cmd_trace_show)


def _add_indices(wsub: argparse._SubParsersAction) -> None:
    ip = wsub.add_parser("indices", help="draw embedding indices and measure their locality")
    ip.add_argument("--locality", type=number(0, 1), help="share of lookups on the hottest rows (ElasticRec's P)")
    ip.add_argument("--zipf", type=positive, help="Zipf exponent alpha instead of --locality")
    ip.add_argument("--hot-fraction", type=number(0, 1, low_open=True), default=0.1,
                    help="share of the rows that are hot, for --locality and the measured locality "
                         "(default %(default)s)")
    ip.add_argument("--hot", choices=("scattered", "first"), default="scattered", help="where the hot rows lie")
    ip.add_argument("--perm-seed", type=int, default=0, help="seed of the scattered hot-row layout")
    ip.add_argument("--rows", type=_positive_int, default=10000, help="rows of the table (default %(default)s)")
    ip.add_argument("--n", type=_positive_int, default=100000, help="lookups to draw (default %(default)s)")
    ip.add_argument("--seed", type=seed, default=0, help="seed of the lookups (default %(default)s)")
    ip.add_argument("--out", help="save the indices (.npy)")
    ip.set_defaults(func=cmd_indices)


def _add_arrivals(wsub: argparse._SubParsersAction) -> None:
    ap = wsub.add_parser("arrivals", help="a Poisson query stream (arrival times and sizes)")
    ap.add_argument("--qps", type=qps, required=True, help="mean arrival rate, queries per second")
    ap.add_argument("--n", type=_positive_int, default=10000, help="queries in the stream (default %(default)s)")
    ap.add_argument("--dist", default="production",
                    help="query sizes: production | lognormal[:mu=,sigma=] | normal[:mean=,sd=] | fixed:N | "
                         "file:PATH (default %(default)s)")
    ap.add_argument("--param", action="append", metavar="KEY=VALUE",
                    help="query-size distribution parameter (repeatable)")
    ap.add_argument("--integer-ms", action="store_true", help="DeepRecSys' integer Poisson gaps in ms")
    ap.add_argument("--seed", type=seed, default=0, help="random seed (default %(default)s)")
    ap.add_argument("--out", help="save the stream (.npz or .csv)")
    ap.add_argument("--json", action="store_true", help="also print a JSON summary")
    ap.set_defaults(func=cmd_arrivals)
