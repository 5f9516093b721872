"""`recserve serve` as a process against the signals an operator sends: while the models load, SIGHUP once
serving, and a second signal while the node drains.  Each run keeps its temporary folders in a TMPDIR of its own,
so what a stop leaves behind is seen."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.support import http
from tests.support.nodes import generous, generous_yaml

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

READY_LINE = re.compile(r"on http://127\.0\.0\.1:(\d+) grpc 127\.0\.0\.1:(\d+)")
class Serve:
    """One ``recserve serve`` child, its stderr read line by line and its temporary folders in a TMPDIR of its
    own."""

    def __init__(self, *args: str) -> None:
        # short: a Unix socket's path holds at most 107 bytes, and pytest's own folders are deep
        self.tmp = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
        env = {**os.environ, "TMPDIR": str(self.tmp)}
        self.proc = subprocess.Popen([sys.executable, "-m", "recserve.cli", "serve", "--http-port", "0",
                                      "--grpc-port", "0", *args], stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            if m := READY_LINE.search(line):
                self.ports.update(http=int(m.group(1)), grpc=int(m.group(2)))
                self.ready.set()

    def wait_for(self, text: str, timeout_s: float = 150) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert time.monotonic() < deadline and self.proc.poll() is None, self.log()
            time.sleep(0.05)

    def log(self) -> str:
        return "".join(self.lines)

    def left_behind(self) -> list[str]:
        return sorted(str(p.relative_to(self.tmp)) for p in self.tmp.rglob("*"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def serve():
    started: list[Serve] = []

    def start(*args: str) -> Serve:
        started.append(Serve(*args))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def _repository(root: Path) -> Path:
    """Two models: ``a_broken`` (no model file) fails at once, then ``ctr`` takes seconds to load (its check in a
    child process, its worker's start)."""
    from recserve.zoo.artifacts import write_version
    from tests.test_repository import trained

    for name in ("a_broken", "ctr"):
        (root / name).mkdir(parents=True)
        (root / name / "config.yaml").write_text(f"workers: 1\n{generous_yaml()}")
    write_version(trained(0, "ctr"), root / "ctr", 1, "torchscript")
    (root / "a_broken" / "1").mkdir()
    return root


def test_sigterm_while_the_models_load_stops_cleanly(serve, tmp_path):
    node = serve("--repository", str(_repository(tmp_path / "repo")))
    node.wait_for("a_broken version 1 not loaded")  # ctr is loading now
    node.proc.send_signal(signal.SIGTERM)
    code = node.proc.wait(60)
    assert node.left_behind() == [], node.log()
    assert code == 0, node.log()
    assert "SIGTERM while starting: stopping" in node.log(), node.log()


def test_sighup_drains_and_stops_like_sigterm(serve):
    node = serve("--model", "hercules-rmc1", "--scale", "1e-4")
    assert node.ready.wait(150), node.log()
    assert http.get(node.ports["http"], "/v2/health/ready").status == 200
    node.proc.send_signal(signal.SIGHUP)
    assert node.proc.wait(60) == 0, node.log()
    assert "SIGHUP: draining in-flight queries" in node.log(), node.log()
    assert node.left_behind() == [], node.left_behind()


def test_a_second_signal_ends_the_drain_at_once(serve, tmp_path):
    """A query held for a stopped (SIGSTOP) worker keeps the drain waiting up to drain_timeout_s (30 s); a second
    SIGTERM stops the node now: the query is answered 503 and the worker killed."""
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"models": [generous({"model": "hercules-rmc1", "scale": 1e-4})]}))
    node = serve("--config", str(config))
    assert node.ready.wait(150), node.log()
    port = node.ports["http"]
    worker = http.get_json(port, "/control/models/hercules-rmc1")["stages"]["model"]["worker_detail"][0]["pid"]
    os.kill(worker, signal.SIGSTOP)
    try:
        node.wait_for("the server process accepts them", timeout_s=30)  # the supervisor covers its socket
        answers: list[int] = []
        query = threading.Thread(target=lambda: answers.append(_infer(port)))
        query.start()
        deadline = time.monotonic() + 30
        while http.get_json(port, "/control/models/hercules-rmc1")["in_flight"] < 1:
            assert time.monotonic() < deadline, node.log()
            time.sleep(0.05)
        node.proc.send_signal(signal.SIGTERM)
        node.wait_for("draining in-flight queries")
        stopping = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        assert node.proc.wait(60) == 0, node.log()
        assert time.monotonic() - stopping < 15, node.log()
        query.join(30)
        assert answers == [503], (answers, node.log())
        assert not os.path.exists(f"/proc/{worker}") or _zombie(worker), node.log()
        assert node.left_behind() == [], node.left_behind()
    finally:
        if os.path.exists(f"/proc/{worker}"):
            os.kill(worker, signal.SIGKILL)


def _infer(port: int) -> int:
    from recserve.specs import get_model
    from recserve.zoo.batch import random_batch

    spec = get_model("hercules-rmc1")
    batch = random_batch(spec.dense_in, spec.scaled_rows(1e-4), tuple(t.pooling for t in spec.tables), 2, 0)
    reply = http.infer(port, "hercules-rmc1", batch.as_arrays(), timeout_s=120)
    return reply.status


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
