"""recserve's own io_uring layer and its detection: a crashing probe never takes the caller down (issue #13)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from recserve.embedding import uring
from recserve.embedding.blockio import BlockReader, TableIOError, io_uring_available
from recserve.embedding.tablefile import write_table
from recserve.embedding.tiered import TieredTable, TierResources
from recserve.zoo import DramTable

CRASH = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"  # what the AVX-512 liburing wheel did


@pytest.fixture
def fresh_probe(monkeypatch):
    """A forgotten verdict before and after (the next test probes for real again)."""
    uring.reset_probe()
    yield monkeypatch
    uring.reset_probe()


def test_probe_killed_by_a_signal_means_unavailable_and_reads_stay_exact(fresh_probe, disk_dir, caplog):
    fresh_probe.setattr(uring, "PROBE_CODE", CRASH)
    ok, why = uring.probe()
    assert not ok and "SIGILL" in why
    assert os.environ[uring.PROBE_ENV].startswith("unavailable: ") and "SIGILL" in os.environ[uring.PROBE_ENV]
    assert "io_uring unavailable here" in caplog.text and caplog.text.count("io_uring unavailable here") == 1
    assert uring.probe() == (ok, why)  # decided once

    torch.manual_seed(0)
    dram = DramTable(900, 24)
    path = os.path.join(disk_dir, "t.tbl")
    write_table(path, dram.weight, "fp32")
    tiered = TieredTable(path, TierResources(None, engine="auto", max_outstanding=8))
    assert tiered.reader.engine == "threads" and "SIGILL" in tiered.reader.engine_reason
    rng = np.random.default_rng(0)
    idx = torch.from_numpy(rng.integers(0, 900, size=300))
    offsets = torch.arange(0, 300, 10)
    assert torch.equal(tiered.pool(idx, offsets), dram.pool(idx, offsets))
    tiered.close()
    with pytest.raises(TableIOError, match="io_uring requested but unavailable here.*SIGILL"):
        BlockReader(path, 4096, engine="io_uring")


@pytest.mark.parametrize("code, timeout, expect", [
    ("raise SystemExit('kernel.io_uring_disabled is 2')", 20.0, "io_uring_disabled is 2"),
    ("import time; time.sleep(30)", 0.5, "did not finish"),
    ("print('maybe')", 20.0, "probe failed"),
])
def test_probe_failures_carry_their_reason(fresh_probe, code, timeout, expect):
    fresh_probe.setattr(uring, "PROBE_CODE", code)
    fresh_probe.setattr(uring, "PROBE_TIMEOUT_S", timeout)
    ok, why = uring.probe()
    assert not ok and expect in why


def test_verdict_is_inherited_without_probing_again(fresh_probe):
    fresh_probe.setenv(uring.PROBE_ENV, "unavailable: seccomp says no")

    def must_not_run() -> tuple[bool, str]:
        raise AssertionError("probed again")

    fresh_probe.setattr(uring, "_run_probe", must_not_run)
    assert uring.probe() == (False, "seccomp says no")


@pytest.mark.skipif(not io_uring_available(), reason="io_uring unavailable on this host")
def test_ring_reads_exact_bytes_and_reports_errors_per_read(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, size=3 * 4096 + 100, dtype=np.uint8)
    path = tmp_path / "f.bin"
    data.tofile(path)
    ring = uring.Ring(4)  # fewer entries than reads: the loop refills the ring
    buf = np.zeros(6 * 4096, dtype=np.uint8)
    vec = uring.iovecs_for(buf.ctypes.data, 4096, 6)
    fd = os.open(path, os.O_RDONLY)
    try:
        offsets = np.array([0, 8192, 4096, 3 * 4096, 5 * 4096, 0], dtype=np.int64)
        res = uring.read_windows(ring, fd, 4096, buf.ctypes.data, offsets, vec)
    finally:
        os.close(fd)
    assert list(res) == [4096, 4096, 4096, 100, 0, 4096]  # short read at the tail, 0 past EOF
    for i, off in enumerate(offsets[:3]):
        assert np.array_equal(buf[i * 4096:(i + 1) * 4096], data[off:off + 4096])
    bad = uring.read_windows(ring, 987654, 4096, buf.ctypes.data, np.array([0], dtype=np.int64), vec)
    assert bad[0] == -9  # EBADF, reported per read, not raised
    ring.close()
