"""The few constants of the analytic model, kept in a JSON file (numbers live in files, not code).

``calibration_default.json`` ships stated assumptions; ``recserve profile calibrate`` fits the
host-measurable ones (framework overheads, compute efficiency, gather costs) to measured
``latency_vs_batch`` tables and writes a new file with the same layout.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from recserve.errors import ProfileError
from recserve.jsonio import read_json

# 2: per_module_us, stream_gbs_per_core added; per_op_us counts ATen operators dispatched
CALIBRATION_VERSION = 2


@dataclass(frozen=True)
class Calibration:
    """Constants of :class:`recserve.perfmodel.PerfModel` (units in the names)."""

    fixed_ms: float  # per inference call: framework entry/exit
    per_op_us: float  # per ATen operator dispatched (counted on the zoo module)
    per_module_us: float  # per nn.Module invoked (Python call, hooks)
    compute_eff: float  # fraction of peak FLOP/s a large batch reaches on one core
    batch_half: float  # GEMM rows at which efficiency is half of compute_eff
    lookup_ns: float  # per embedding id: index handling independent of row width
    llc_gbs_per_core: float  # row bytes/s one core gathers from the LLC
    dram_gbs_per_core: float  # row bytes/s one core gathers from DRAM (random rows)
    stream_gbs_per_core: float  # weight bytes/s one core streams from DRAM (sequential, prefetched)
    act_gbs_per_core: float  # activation bytes/s one core writes and re-reads between dense layers
    op_serial: float  # Amdahl serial fraction of op-parallelism inside one model-based thread
    membw_eff: float  # fraction of the server's peak memory bandwidth random gathers can use
    zipf_s: float  # default index locality (Zipf exponent, 0 = uniform ids)
    p99_over_mean: float  # service-time tail of one call (p99 / mean)
    runtime_gb_per_worker: float  # interpreter + framework + activations per worker
    mem_usable_frac: float  # fraction of DRAM the serving stack may fill
    idle_power_frac: float  # idle power as a fraction of provisioned power
    gpu_launch_us: float  # per kernel launched on the accelerator
    gpu_compute_eff: float  # fraction of accelerator peak at large batch
    gpu_batch_half: float  # batch at which accelerator efficiency is half of gpu_compute_eff
    gpu_gather_eff: float  # fraction of accelerator memory bandwidth random gathers reach
    pcie_eff: float  # fraction of PCIe bandwidth a transfer reaches
    pcie_latency_us: float  # per host-device transfer
    # Input feeding of a serving stack that hands the model its ids as Python lists (Allocation.feed == "pylist",
    # e.g. the DeepRecSys harness behind the Kairos artifact: ``FeedBlob(np.array(list))`` per table per call).
    # Measured on the dev host (AMD EPYC, 2.45 GHz, numpy 2.x, one thread) by ``microbench.feed_costs``:
    # ``np.array(list of Python ints)`` 28.0 ns/element, ``np.array(list of np.int32)`` 40.6 ns/element, one
    # ``np.array`` call 0.35 µs.  Optional in calibration files (older files get these values).
    feed_pyint_ns: float = 28.0  # per id converted from a Python int
    feed_npscalar_ns: float = 40.6  # per bag length converted from a numpy scalar
    feed_call_us: float = 0.35  # per array converted (one per ids list, one per lengths list)
    feed_ref_ghz: float = 2.45  # clock the feed costs were measured at (interpreter-bound: scale with clock)
    # Bytes of table rows whose pages the second-level TLB maps (stated, not fitted: 2048 entries x 4 KB pages on x86
    # server cores since Skylake-SP / Zen 2; 0 = no limit, e.g. tables on huge pages).  A gather beyond it pays a page
    # walk per row even when the row is LLC-resident; it is costed like a DRAM miss (docs/perfmodel.md).
    tlb_reach_mb: float = 8.388608  # 2048 x 4096 bytes
    # Bytes/s at which one thread first-touches freshly mapped memory (a page fault and the kernel zeroing the page per
    # 4 KB).  A tensor larger than glibc's mmap threshold cap (32 MiB, ``cost.MMAP_MAX_BYTES``) is mmapped and unmapped
    # on every call, so each call pays this for it (DIN at batch 512: three 41 MB activations).  Measured, not fitted:
    # ``microbench.fresh_memory_gbs`` on the dev host, 2026-11-23 (1.8 GB/s; a 48 MB ReLU output, 12,289 faults/call).
    fault_gbs_per_core: float = 1.8
    fitted_on: str = ""
    fit_error: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        constants = {k: v for k, v in asdict(self).items() if k not in ("fitted_on", "fit_error")}
        out: dict[str, Any] = {"version": CALIBRATION_VERSION, "fitted_on": self.fitted_on, "constants": constants}
        if self.fit_error is not None:
            out["fit_error"] = self.fit_error
        return out

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    def with_values(self, **values: float) -> Calibration:
        return replace(self, **values)


CONSTANT_NAMES = tuple(f.name for f in fields(Calibration) if f.name not in ("fitted_on", "fit_error"))
# constants added after version 2 files were written: a file without them gets the dataclass default
OPTIONAL_CONSTANTS = frozenset(f.name for f in fields(Calibration)
                               if f.name in CONSTANT_NAMES and f.default is not MISSING)


def calibration_from_dict(data: dict[str, Any], where: str = "calibration") -> Calibration:
    if not isinstance(data, dict) or "constants" not in data:
        raise ProfileError(f"{where}: not a calibration (it holds no 'constants'; `recserve profile calibrate` writes "
                           "one)")
    if data.get("version") != CALIBRATION_VERSION:
        found = data.get("version") if isinstance(data, dict) else None
        raise ProfileError(f"{where}: calibration version {found!r} is not supported "
                           f"(this recserve reads version {CALIBRATION_VERSION})")
    constants = data.get("constants", {})
    unknown = sorted(set(constants) - set(CONSTANT_NAMES))
    missing = [n for n in CONSTANT_NAMES if n not in constants and n not in OPTIONAL_CONSTANTS]
    if unknown or missing:
        raise ProfileError(f"{where}: calibration constants unknown {unknown}, missing {missing}")
    return Calibration(**{k: float(constants[k]) for k in CONSTANT_NAMES if k in constants},
                       fitted_on=str(data.get("fitted_on", "")), fit_error=data.get("fit_error"))


def load_calibration(path: str | Path | None = None) -> Calibration:
    """The calibration at ``path``, or the bundled defaults when ``path`` is None."""
    if path is None:
        text = (resources.files("recserve") / "perfmodel" / "calibration_default.json").read_text()
        return calibration_from_dict(json.loads(text), "bundled calibration_default.json")
    data = read_json(path, ProfileError, "calibration file", "make one with `recserve profile calibrate`")
    return calibration_from_dict(data, str(path))
