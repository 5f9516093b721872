"""Service time of one call of ``m`` items on a server: the per-item gather (LLC hits, DRAM misses, NMP), the dense
part's FLOPs and weights, framework overheads, the Python feed, page faults, and the accelerator path (launches,
PCIe, the device's share between co-located workers).  ``PerfModel`` composes these into latency and max load."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from recserve.perfmodel.calibration import Calibration
from recserve.perfmodel.cost import MMAP_MAX_BYTES, ModelCost
from recserve.specs import ModelSpec, ServerType

if TYPE_CHECKING:
    from recserve.perfmodel.model import Allocation, _Static

# GEMM rows below which a dense product is a matrix-vector product (BLAS's GEMV path, no batch_half penalty)
GEMV_ROWS = 1.5


class ServiceTimes:
    """Per-stage service times (ms) from one calibration."""

    def __init__(self, cal: Calibration) -> None:
        self.cal = cal

    @staticmethod
    def miss_bytes(st: _Static, m: np.ndarray, nmp: bool, dram: bool = False) -> np.ndarray:
        """Gathered bytes per item at call size ``m`` costed as DRAM misses (tables handled near memory excluded);
        ``dram=True``: the bytes that miss the LLC (memory traffic; the TLB reach does not limit them).

        Steady-state misses come from the hot rows that fit the cache across calls; within one call a
        table's rows are fetched once if the rows it touches fit the cache (uniform-draw estimate of
        distinct rows), so repeated ids in a batch hit.
        """
        cost = st.cost
        rows = np.array(cost.table_rows, dtype=float)
        lookups = np.array(cost.table_lookups, dtype=float)
        row_bytes = np.array(cost.table_row_bytes, dtype=float)
        keep = ~((lookups > 1) & nmp) if nmp else np.ones_like(rows, dtype=bool)
        n = np.asarray(m, dtype=float)[:, None] * lookups[None, :]
        distinct = rows * -np.expm1(-n / rows)
        cache, table_miss = (st.dram_cache_bytes, st.table_miss_dram) if dram else (st.cache_bytes, st.table_miss)
        within = np.where(distinct * row_bytes <= cache, distinct / np.maximum(n, 1e-12), 1.0)
        miss = table_miss[None, :] * within
        return (miss * (lookups * row_bytes * keep)[None, :]).sum(axis=1)

    def call_times(self, spec: ModelSpec, server: ServerType, alloc: Allocation, st: _Static, m: np.ndarray,
                    slow: float) -> list[np.ndarray]:
        """Per-stage service time (ms) of one call of ``m`` items: [model] or [sparse, dense].  On a server whose
        cores run at a sustained share below 1 (burstable instances) the host's CPU time stretches by 1/share."""
        times = self.full_speed_times(spec, server, alloc, st, m, slow)
        if server.cpu_share >= 1.0 or st.on_accel:
            return times
        return [t / server.cpu_share for t in times]

    def full_speed_times(self, spec: ModelSpec, server: ServerType, alloc: Allocation, st: _Static, m: np.ndarray,
                          slow: float) -> list[np.ndarray]:
        cal, cost = self.cal, st.cost
        c = alloc.cores_per_worker
        dram_s = 1.0 / (cal.dram_gbs_per_core * 1e9)
        llc_s = 1.0 / (cal.llc_gbs_per_core * 1e9)
        cached_bytes = cost.gather_bytes_per_item - (cost.multihot_bytes_per_item if st.nmp_ranks else 0.0)
        miss_bytes = self.miss_bytes(st, m, bool(st.nmp_ranks))
        per_item_gather = (cost.lookups_per_item * cal.lookup_ns * 1e-9
                           + (cached_bytes - miss_bytes) * llc_s + miss_bytes * slow * dram_s)
        if st.nmp_ranks:  # NMP: rank-parallel gather-reduce of multi-hot tables in memory (Hercules S3-S5)
            per_item_gather += cost.multihot_bytes_per_item * slow * dram_s / st.nmp_ranks
        host_sparse = m * per_item_gather * st.host_gather_frac * 1e3  # ms on one core
        # every call reads all dense weights once: from the LLC what fits, streamed from DRAM the rest
        weights_ms = cost.weight_bytes * ((1.0 - st.miss_w) * llc_s
                                          + st.miss_w * slow / (cal.stream_gbs_per_core * 1e9)) * 1e3
        feed = self.feed_ms(server, alloc, st, m)
        if st.on_accel:
            return self.accel_times(server, alloc, st, m, host_sparse, feed)
        cpu_flops = server.freq_ghz * 1e9 * server.flops_per_cycle
        rows = m * cost.gemm_rows_per_item
        # a single-row product (an MLP at batch 1) runs BLAS's matrix-vector path: it reads the weights once (already
        # in weights_ms) and pays none of the GEMM's per-call work on weight panels that batch_half stands for (the GEMM
        # microbenchmark's 1-row point is 1.2-1.9x above the curve through rows >= 4 in all three recordings)
        eff = np.where(rows < GEMV_ROWS, cal.compute_eff, cal.compute_eff * rows / (rows + cal.batch_half))
        dense_ms = (cost.flops_per_item * m / (cpu_flops * eff)
                    + cost.activation_bytes_per_item * m / (cal.act_gbs_per_core * 1e9)) * 1e3 + self.fresh_ms(cost, m)
        if not alloc.pipeline:
            speed = c / (1.0 + cal.op_serial * (c - 1))
            over = cal.fixed_ms + self.overhead_ms(cost, sparse=True) + self.overhead_ms(cost, sparse=False)
            return [over + feed + (dense_ms + weights_ms + host_sparse) / speed]
        hop_ms = m * cost.pooled_bytes_per_item * llc_s * 1e3
        sparse = cal.fixed_ms + self.overhead_ms(cost, sparse=True) + feed + host_sparse / c + hop_ms
        dense = cal.fixed_ms + self.overhead_ms(cost, sparse=False) + dense_ms + weights_ms + hop_ms
        return [sparse, dense]

    def fresh_ms(self, cost: ModelCost, m: np.ndarray) -> np.ndarray | float:
        """Page faults (ms) of one call's tensors past glibc's mmap threshold cap: mapped fresh every call, so every
        4 KB page faults in and is zeroed, at ``fault_gbs_per_core`` (DIN at batch 512 on both recorded hosts)."""
        if not cost.alloc_bytes_per_item or self.cal.fault_gbs_per_core <= 0:
            return 0.0
        sizes = np.asarray(m, dtype=float)[..., None] * np.array(cost.alloc_bytes_per_item)
        fresh = np.where(sizes > MMAP_MAX_BYTES, sizes, 0.0).sum(axis=-1)
        return fresh / (self.cal.fault_gbs_per_core * 1e9) * 1e3

    def feed_ms(self, server: ServerType, alloc: Allocation, st: _Static, m: np.ndarray) -> np.ndarray | float:
        """Host time (ms) to turn one call's ids from Python lists into arrays (``alloc.feed == "pylist"``): per
        table one ``np.array`` of its ``m·pooling`` ids (Python ints) and one of its ``m`` bag lengths (numpy
        scalars), interpreter-bound, so scaled from the clock the costs were measured at to the server's clock.
        On an accelerator every converted array is also one host-to-device copy (``pcie_latency_us`` each; their
        bytes are already in the accelerator path's transfer)."""
        if alloc.feed != "pylist":
            return 0.0
        cal, cost = self.cal, st.cost
        tables = len(cost.table_lookups)
        ns = (cost.lookups_per_item * cal.feed_pyint_ns + tables * cal.feed_npscalar_ns) * m
        ms = (ns * 1e-6 + 2 * tables * cal.feed_call_us * 1e-3) * cal.feed_ref_ghz / server.freq_ghz
        if st.on_accel:
            ms = ms + (2 * tables + 1) * cal.pcie_latency_us * 1e-3  # ids and lengths per table, and dense input
        return ms

    def overhead_ms(self, cost: ModelCost, sparse: bool) -> float:
        """Framework time of one call's sparse or dense part: per module invoked and per operator dispatched."""
        ops, modules = (cost.sparse_ops, cost.sparse_modules) if sparse else (cost.dense_ops, cost.dense_modules)
        return (self.cal.per_op_us * ops + self.cal.per_module_us * modules) * 1e-3

    def accel_times(self, server: ServerType, alloc: Allocation, st: _Static, m: np.ndarray,
                     host_sparse: np.ndarray, feed: np.ndarray | float = 0.0) -> list[np.ndarray]:
        cal, cost = self.cal, st.cost
        c = alloc.cores_per_worker
        launch = self.launch_ms(cost, with_sparse=not alloc.pipeline)
        pcie_bw = max(server.pcie_gbs, 1e-3) * 1e9 * cal.pcie_eff
        device_bw = max(server.accel_mem_bw_gbs, 1e-3) * 1e9 * cal.gpu_gather_eff
        tflops = max(server.accel_tflops, 1e-6) * 1e12
        rows = m * cost.gemm_rows_per_item
        eff = cal.gpu_compute_eff * rows / (rows + cal.gpu_batch_half)
        dense_dev = cost.flops_per_item * m / (tflops * eff) * 1e3
        inputs = cost.dense_in_bytes_per_item * m
        if alloc.pipeline:  # SparseNet on host cores, pooled vectors over PCIe to the DenseNet on the device
            xfer = (inputs + cost.pooled_bytes_per_item * m) / pcie_bw * 1e3 + cal.pcie_latency_us * 1e-3
            host = cal.fixed_ms + self.overhead_ms(cost, sparse=True) + feed + host_sparse / c
            dev = dense_dev
            host_dev = launch + xfer
            return [host, self.shared_device(host_dev, dev, alloc.workers)]
        dev_gather = m * cost.gather_bytes_per_item * (1 - st.host_gather_frac) / device_bw * 1e3
        psum = cost.pooled_bytes_per_item * m if st.host_gather_frac > 0 else 0.0
        xfer = (inputs + cost.index_bytes_per_item * m + psum) / pcie_bw * 1e3 + cal.pcie_latency_us * 1e-3
        speed = c / (1.0 + cal.op_serial * (c - 1))
        host = cal.fixed_ms + launch + xfer + feed + host_sparse / speed
        return [self.shared_device(host, dense_dev + dev_gather, alloc.workers)]

    def launch_ms(self, cost: ModelCost, with_sparse: bool = True) -> float:
        """Host time (ms) to issue one call's work to the device: the framework's own time, as on a CPU (per operator
        dispatched and per module invoked: Python and the dispatcher run the same code whatever the device; an RNN
        module dispatches its cuDNN call, not its CPU per-step operators), plus ``gpu_launch_us`` per kernel launched.

        Kernels are counted per operator that writes a tensor of its own (``ModelCost.device_*_launches``), not per
        operator dispatched: views (``select``, ``chunk``, ``view``...) launch nothing.  Charging every dispatched
        operator a launch had to carry the per-module Python time of the per-table models in ``gpu_launch_us``:
        fitted on din, wnd, rmc2 and dlrm-a it came out at 14 us a launch, and hera-dien (1,959 dispatched operators,
        1,278 kernels, 59 modules) was predicted at 28 ms against 10.3 ms measured at batch 1 on the H100
        (docs/measured/h100-2026-11-22/bench_gpu_run1.json), i.e. ~5 us per operator there."""
        dense_ops = cost.device_dense_ops or cost.dense_ops
        dense_kernels = cost.device_dense_launches or dense_ops
        sparse_kernels = cost.device_sparse_launches or cost.sparse_ops
        framework = self.cal.per_op_us * dense_ops + self.cal.per_module_us * cost.dense_modules
        kernels = dense_kernels
        if with_sparse:
            framework += self.cal.per_op_us * cost.sparse_ops + self.cal.per_module_us * cost.sparse_modules
            kernels += sparse_kernels
        return (framework + self.cal.gpu_launch_us * kernels) * 1e-3

    @staticmethod
    def shared_device(host: np.ndarray, dev: np.ndarray, workers: int) -> np.ndarray:
        """Service time when ``workers`` co-located threads time-share one device (MPS-style)."""
        share = dev / np.maximum(host + dev, 1e-12)
        return host + dev * (1.0 + (workers - 1) * share)
