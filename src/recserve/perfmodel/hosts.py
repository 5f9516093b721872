"""Recorded hosts: what lets one command calibrate a machine the perfmodel has never seen (issue #18).

Each file under ``recserve/data/hosts/`` holds one machine's model timings (``latency_vs_batch`` tables, every
other buildable catalogue model at an LLC-resident and a DRAM-bound table size, batches 1..512) and the same
machine's microbenchmarks (``meta.micro``), recorded by ``benchmarks/bench_transfer.py --record NAME``.

A new host runs only the microbenchmarks (a minute or two, no model timed).  Its calibration is then the constants
fitted on the *other* recorded hosts' model timings, carried over by the two hosts' microbenchmarks
(:func:`recserve.perfmodel.microbench.transfer_calibration`): leave-one-host-out over the three recorded hosts,
14.3 % (Zen 2 dev VM), 15.5 % (H100 host) and 17.0 % (Zen 1 VM) median error against 38.6 / 37.0 / 25.6 % for the
microbenchmark-only constants, because kernels timed alone run faster than the same kernels inside a model, by a
factor the recorded models carry and the microbenchmarks do not.  A recording of the machine being calibrated is
never used for it (it would not be a transfer).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recserve.perfmodel.calibration import Calibration
from recserve.profiles import ProfileSet
from recserve.specs import ServerType, to_dict

HOSTS_DIR = Path(__file__).resolve().parent.parent / "data" / "hosts"
HARDWARE = ("cores", "freq_ghz", "flops_per_cycle", "llc_mb", "llc_ways", "mem_gb")


@dataclass(frozen=True)
class Machine:
    """Who a recording (or this run) comes from: its hostname and the hardware facts of its ServerType."""

    hostname: str
    facts: dict[str, Any]

    @classmethod
    def of(cls, recording: ProfileSet) -> Machine:
        host = recording.meta.get("host", {})
        return cls(str(recording.meta.get("hostname", "")), {k: host.get(k) for k in HARDWARE})

    @classmethod
    def this(cls, host: ServerType) -> Machine:
        """The machine this process runs on, described by ``host`` (``hostbench.calibration_host()``)."""
        facts = to_dict(host)
        return cls(socket.gethostname(), {k: facts.get(k) for k in HARDWARE})

    def same_as(self, other: Machine) -> bool:
        """Same hostname *and* same hardware facts: hostnames alone are not enough (containers are often all called
        ``vm``); whole ServerType dicts are too much (their notes and assumed fields change between versions)."""
        return self.hostname == other.hostname and self.facts == other.facts


def recorded_hosts(directory: Path | str | None = None) -> dict[str, ProfileSet]:
    """Every recording (name -> ProfileSet) that carries microbenchmarks and a host description."""
    root = Path(directory) if directory is not None else HOSTS_DIR
    out = {}
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        recording = ProfileSet.load(path)
        if "micro" in recording.meta and "host" in recording.meta:
            out[path.stem] = recording
    return out


@dataclass(frozen=True)
class Transferred:
    """A calibration carried to a host, and what it was made from."""

    calibration: Calibration
    fitted: Calibration  # the same fit before it was carried (what the sources' timings alone give)
    sources: tuple[str, ...]  # recorded hosts whose model timings were fitted
    skipped: tuple[str, ...]  # recordings of this same machine, left out


def calibration_for_host(micro: dict[str, Any], machine: Machine, base: Calibration,
                         recorded: dict[str, ProfileSet] | None = None) -> Transferred | None:
    """Constants fitted on the recorded hosts other than ``machine``, carried to it by its microbenchmarks
    ``micro``; None when no other host is recorded (the caller falls back to the microbenchmark-only constants)."""
    from recserve.perfmodel.fit import fit, points_from_profiles
    from recserve.perfmodel.microbench import transfer_calibration
    from recserve.specs import server_from_dict

    recorded = recorded_hosts() if recorded is None else recorded
    skipped = tuple(n for n, r in recorded.items() if Machine.of(r).same_as(machine))
    sources = {n: r for n, r in recorded.items() if n not in skipped}
    if not sources:
        return None
    points = {n: points_from_profiles(r, server_from_dict("this-host", r.meta["host"])) for n, r in sources.items()}
    fitted = fit([p for pts in points.values() for p in pts], base)
    label = (f"fitted on the model timings of recorded hosts {', '.join(sources)}, carried to {micro.get('host')} "
             f"by its microbenchmarks ({float(micro.get('seconds', 0)):.0f} s; no model timed here)")
    cal = transfer_calibration(fitted, [(source_micro(sources[n]), len(points[n])) for n in sources], micro, label)
    return Transferred(cal, fitted, tuple(sources), skipped)


def source_micro(recording: ProfileSet) -> dict[str, Any]:
    """A recording's microbenchmarks, with ``model_module_us`` (framework time per module inside a whole model) taken
    from its own model timings where it was recorded before that microbenchmark existed: the recorded batch-1 call of
    the same probe model at the small table size, per module.  The two agree within 1.5 % (Zen 1 VM) and 7 % (H100
    host) on the recordings that have both; without it, one old recording kept every host's overheads unscaled."""
    micro = dict(recording.meta["micro"])
    if "model_module_us" in micro:
        return micro
    from recserve.perfmodel.microbench import IN_MODEL_PROBE, modules_called

    for table in recording.find(model=IN_MODEL_PROBE, kind="latency_vs_batch"):
        if table.conditions.get("tables") != "small":
            continue
        batch_1 = [row for row in table.rows if row[0] == 1]
        if batch_1:
            calls = modules_called(IN_MODEL_PROBE, float(table.conditions["scale"]))
            micro["model_module_us"] = float(batch_1[0][1]) * 1e3 / calls
            micro["model_module_us_from"] = f"recorded {IN_MODEL_PROBE} batch 1, small tables"
    return micro
