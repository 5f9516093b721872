"""Torch work on threads other than the main one keeps the process's intra-op thread count.

Found on a 16-core host: a node worker (``torch.set_num_threads(1)``, pinned to one core) ran its compute thread's
GEMMs on 16 threads, all on that core; one worker then met its SLA at 7.8 QPS instead of 112.  Checked in a child
process (this one's thread settings are pytest's) by CPU time over wall time while a GEMM runs: ~1 with one
thread, ~the core count without the fix.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

CHILD = r"""
import asyncio, threading, time
import torch
torch.set_num_threads(1)
from recserve.serving.worker.compute_thread import ComputeThread

a = torch.randn(1500, 1500)

def compute(arrays):
    for _ in range(12):
        a @ a
    return []

loop = asyncio.new_event_loop()
thread = ComputeThread(loop, compute, threading.Lock())
done = loop.create_future()
cpu, wall = time.process_time(), time.perf_counter()
thread.submit([], lambda result, error, seconds: done.set_result(error))
assert loop.run_until_complete(done) is None
print((time.process_time() - cpu) / (time.perf_counter() - wall))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to tell one thread from several")
def test_the_workers_compute_thread_runs_torch_on_the_workers_thread_count():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": ""})
    assert out.returncode == 0, out.stderr
    cores_used = float(out.stdout.split()[-1])
    assert cores_used < 1.4, f"the compute thread's GEMMs used {cores_used:.2f} cores with set_num_threads(1)"
