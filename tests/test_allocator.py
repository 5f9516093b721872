"""The workers' allocator settings (zoo/allocator.py): a model's large activations reuse freed memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recserve.zoo.allocator import WORKER_TUNABLES, worker_tunables

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

CHILD = """
import resource, threading, torch
from recserve.specs import catalogue_models
from recserve.zoo import build, sample_batch
torch.set_num_threads(1)
model = build(catalogue_models()["hera-din"], scale=1e-4).eval()
batch = sample_batch(model, 512, rng=1)  # three activations of ~41 MB: above glibc's largest mmap threshold
faults = []
def work():  # on a second thread, as a worker's compute thread runs long passes
    with torch.inference_mode():
        for i in range(4):
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            model(batch)
            if i:
                faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
thread = threading.Thread(target=work)
thread.start()
thread.join()
print(min(faults))
"""


def faults_per_pass(*tunables: str) -> list[int]:
    """The child's faults per pass under each of ``tunables``, the children run side by side (each counts its own
    thread's faults, so they do not disturb each other's count)."""
    procs = []
    try:
        for t in tunables:
            procs.append(subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, env={**os.environ, "GLIBC_TUNABLES": t}))
        faults = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            faults.append(int(out.split()[-1]))
        return faults
    finally:
        for proc in procs:
            proc.kill()  # a no-op for those already reaped
            proc.communicate()


def test_the_user_tunables_win_and_ours_are_added_once():
    assert worker_tunables("") == ":".join(f"{k}={v}" for k, v in WORKER_TUNABLES.items())
    mine = worker_tunables("glibc.malloc.arena_max=4:glibc.rtld.nns=2")
    assert mine.startswith("glibc.malloc.arena_max=4:glibc.rtld.nns=2:") and mine.count("arena_max") == 1
    assert worker_tunables(mine) == mine


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables")
def test_a_large_activation_is_not_faulted_in_again_on_every_pass():
    default, tuned = faults_per_pass("", worker_tunables())
    if default < 2_000:  # transparent huge pages on every mapping, or not glibc: nothing to measure
        pytest.skip(f"a DIN pass at batch 512 costs only {default} faults here")
    assert tuned < default / 5


def test_the_workers_forkserver_starts_with_them(monkeypatch):
    from recserve.serving.node.runtime import WorkerContext

    monkeypatch.setenv("GLIBC_TUNABLES", "")
    WorkerContext()
    assert os.environ["GLIBC_TUNABLES"] == worker_tunables()
