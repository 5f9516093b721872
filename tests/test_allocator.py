"""The workers' allocator settings (zoo/allocator.py): a model's large activations reuse freed memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from recserve.zoo.allocator import WORKER_TUNABLES, worker_tunables

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


def faults_per_pass(tunables: str) -> int:
    env = {**os.environ, "GLIBC_TUNABLES": tunables}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env,
                         check=True)
    return int(out.stdout.split()[-1])


def test_the_user_tunables_win_and_ours_are_added_once():
    assert worker_tunables("") == ":".join(f"{k}={v}" for k, v in WORKER_TUNABLES.items())
    mine = worker_tunables("glibc.malloc.arena_max=4:glibc.rtld.nns=2")
    assert mine.startswith("glibc.malloc.arena_max=4:glibc.rtld.nns=2:") and mine.count("arena_max") == 1
    assert worker_tunables(mine) == mine


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables")
def test_a_large_activation_is_not_faulted_in_again_on_every_pass():
    default = faults_per_pass("")
    if default < 2_000:  # transparent huge pages on every mapping, or not glibc: nothing to measure
        pytest.skip(f"a DIN pass at batch 512 costs only {default} faults here")
    assert faults_per_pass(worker_tunables()) < default / 5


def test_the_workers_forkserver_starts_with_them(monkeypatch):
    from recserve.serving.runtime import WorkerContext

    monkeypatch.setenv("GLIBC_TUNABLES", "")
    WorkerContext()
    assert os.environ["GLIBC_TUNABLES"] == worker_tunables()
