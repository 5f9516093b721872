"""``recserve profile host``: measure Profile tables for catalogue models on this machine.

Writes a ProfileSet (``server="this-host"``, ``source="measured"``): latency_vs_batch,
maxload_vs_workers, footprint, membw_vs_workers (estimated), gather_qps, and host
microbenchmarks (random-read bandwidth, GEMM GFLOP/s) in its meta.  ``--device cuda`` adds the
accelerator's tables under ``this-host-cuda`` (``measure/accel_profile.py``): latency_vs_batch of an
accelerator worker's pass, footprint in device memory, maxload_vs_workers over accelerator workers;
``--device-only`` measures those alone.  Then, e.g.::

    recserve plan pool --profiles gpu.json --models hera-din --servers this-host,this-host-cuda \\
        --price this-host=1.0,this-host-cuda=3.0 --budget 10
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recserve.commands._plan_common import check_half_memory, count, int_list, percentile, positive
from recserve.errors import RecserveError
from recserve.profiles import ProfileSet
from recserve.specs import SLA, ModelSpec, get_model


def _maxload_cell(row: list[float]) -> str:
    workers, qps, violating = int(row[0]), row[1], row[2]
    if qps == 0 and violating == 0:
        return f"{workers}w 0 qps (SLA missed even by queries sent one at a time)"
    if qps == 0 and violating > 0:
        return f"{workers}w < {violating:.2f} qps (SLA missed at the lowest rate probed)"
    return f"{workers}w {qps:.1f} qps"


def _measure(args: argparse.Namespace, specs: list[ModelSpec], batches: list[int], workers: list[int] | None,
             sla: SLA | None) -> ProfileSet:
    """This host's CPU tables (unless ``--device-only``) and, with ``--device``, the accelerator's."""
    from recserve.measure.accel_profile import device_tables
    from recserve.measure.profiler import Budget, profile_host

    if args.device_only and not args.device:
        raise RecserveError("--device-only needs --device (e.g. --device cuda)")
    device_workers = args.device_workers
    if args.device:
        from recserve.serving.node.config import check_device

        check_device(args.device, "--device")
    if args.device_only:
        profiles = ProfileSet(meta={"server": "this-host", "scale": args.scale, "quick": args.quick})
    else:
        profiles = profile_host(specs, args.scale, quick=args.quick, batches=batches,
                                workers=workers, skip_maxload=args.no_maxload, sla=sla, array_mb=args.array_mb,
                                via=args.via)
    if args.device:
        for spec in specs:
            for table in device_tables(spec, args.scale, Budget.of(args.quick), batches,
                                       args.device, device_workers,
                                       skip_maxload=args.no_maxload, sla=sla):
                profiles.add(table)
    return profiles


def _print(args: argparse.Namespace, profiles: ProfileSet, specs: list[ModelSpec]) -> None:
    from recserve.measure.accel_profile import device_server

    host = profiles.meta.get("host", {})
    if host:
        print(f"host: random read {host.get('random_read_gbs')} GB/s, sequential read {host.get('seq_read_gbs')} GB/s, "
              f"GEMM {host.get('gemm_gflops')} GFLOP/s ({host.get('cores')} cores)")
    servers = ([] if args.device_only else ["this-host"]) + ([device_server(args.device)] if args.device else [])
    for spec in specs:
        for server in servers:
            lat = profiles.get(spec.name, server, "latency_vs_batch")
            print(f"{spec.name} on {server} latency_vs_batch (ms{', 1 thread' if server == 'this-host' else ''}):")
            print("  batch      mean       p50       p99")
            for row in lat.rows:
                print(f"  {int(row[0]):5d} {row[1]:9.3f} {row[2]:9.3f} {row[3]:9.3f}")
            for t in profiles.find(spec.name, server, "maxload_vs_workers"):
                print(f"  max load vs workers (p{t.conditions['percentile']:g} <= {t.conditions['sla_ms']:g} ms): "
                      + ", ".join(_maxload_cell(r) for r in t.rows))
            for t in profiles.find(spec.name, server, "footprint"):
                print("  memory: " + ", ".join(f"{int(r[0])}w {r[1]:.3f} GB" for r in t.rows))


def cmd_profile_host(args: argparse.Namespace) -> int:
    import torch

    from recserve.measure.accel_profile import check_device_worker_counts
    from recserve.measure.profiler import BATCHES, check_worker_counts

    torch.set_num_threads(1)
    names = [m for m in args.models.split(",") if m.strip()]
    if not names:
        raise RecserveError("--models needs at least one catalogue model name")
    specs = [get_model(m.strip()) for m in names]
    if not 0 < args.scale <= 1:
        raise RecserveError(f"--scale must be in (0, 1], got {args.scale}")
    if args.array_mb is not None:  # the bandwidth microbenchmarks' arrays
        check_half_memory(args.array_mb, f"--array-mb {args.array_mb}")
    batches = args.batches or list(BATCHES)
    workers = args.workers
    if workers:
        check_worker_counts(workers)
    check_device_worker_counts(args.device_workers)
    sla = None
    if args.sla_ms or args.percentile:
        sla = SLA(args.sla_ms or specs[0].sla.target_ms, args.percentile or specs[0].sla.percentile)
    out = Path(args.out)
    earlier = ProfileSet.load(out) if args.merge and out.exists() else None  # a bad --out fails before measuring
    profiles = _measure(args, specs, batches, workers, sla)
    if earlier is not None:
        profiles = earlier.merge(profiles)
    profiles.save(out)
    print(f"wrote {len(profiles)} tables to {out}")
    _print(args, profiles, specs)
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("host", help="measure Profile tables for models on this host",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True, help="comma-separated catalogue model names")
    p.add_argument("--scale", type=positive, default=1e-3, help="table-row scale for the live models")
    p.add_argument("--out", default="profiles/this-host.json", help="ProfileSet JSON to write")
    p.add_argument("--quick", action="store_true", help="short measurements (about 30 s per model)")
    p.add_argument("--batches", type=int_list, default=None,
                   help="batch sizes for latency_vs_batch (default 1,8,...,1024)")
    p.add_argument("--workers", type=int_list, default=None,
                   help="worker counts for maxload_vs_workers (default 1..cores; at most 4 per core, 256 in all)")
    p.add_argument("--via", choices=("server", "inprocess"), default="server",
                   help="max-load tables through a local node server (HTTP) or an in-process worker pool")
    p.add_argument("--no-maxload", action="store_true", help="skip the max-load / footprint / membw tables")
    p.add_argument("--sla-ms", type=positive, default=None,
                   help="SLA target for the max-load tables (default: each model's own)")
    p.add_argument("--percentile", type=percentile, default=None, help="SLA percentile (default: each model's own)")
    p.add_argument("--array-mb", type=count, default=None,
                   help="array size for the bandwidth microbenchmarks, MiB, at most half this host's memory "
                        "(default 256 quick, 1024 full)")
    p.add_argument("--device", default=None, help="also measure this accelerator's tables (cuda, cuda:N; cpu runs "
                                                   "the same path on a CPU accelerator worker)")
    p.add_argument("--device-workers", type=int_list, default=[1, 2],
                   help="accelerator worker counts for its maxload_vs_workers (default 1,2; at most 8 per device, "
                        "and 4 per core: they time-slice one device, each with its own context and weights)")
    p.add_argument("--device-only", action="store_true", help="measure only the accelerator's tables")
    p.add_argument("--merge", action="store_true", help="merge into --out if it exists instead of replacing it")
    p.set_defaults(func=cmd_profile_host)
