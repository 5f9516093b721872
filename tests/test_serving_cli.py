"""`recserve serve` as a process: pipeline mode (sparse workers feed dense workers) and SIGTERM draining."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from recserve.cli import main
from recserve.serving import build_worker_model, config_from_dict
from recserve.specs import catalogue_models
from recserve.zoo import sample_batch
from tests.support import http
from tests.support.oip_inputs import http_inputs

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
READY_LINE = re.compile(r"on http://127\.0\.0\.1:(\d+) grpc 127\.0\.0\.1:(\d+)")


@pytest.fixture(scope="module")
def pipeline_server(tmp_path_factory):
    data = yaml.safe_load((EXAMPLES / "node-pipeline.yaml").read_text())
    dlrm = sorted(n for n, s in catalogue_models().items() if s.family == "dlrm")
    for m in data["models"]:
        if m["model"] not in catalogue_models():
            m["model"] = dlrm[0]
    data.update(http_port=0, grpc_port=0)
    path = tmp_path_factory.mktemp("node") / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    config = config_from_dict(data)
    proc = subprocess.Popen([sys.executable, "-m", "recserve.cli", "serve", "--config", str(path)],
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ports: dict[str, int] = {}
    found = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            m = READY_LINE.search(line)
            if m:
                ports.update(http=int(m.group(1)), grpc=int(m.group(2)))
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert found.wait(150), "".join(lines)
        yield proc, ports, config, lines, reader
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def test_pipeline_mode_matches_in_process(pipeline_server):
    _, ports, config, _, _ = pipeline_server
    cfg = config.models[0]
    model = build_worker_model(cfg)
    batch = sample_batch(model, 300, rng=9)  # sub_batch 128: three parts, each sparse stage then dense stage
    client = http.triton(ports["http"])
    scores = client.infer(cfg.name, http_inputs(batch)).as_numpy("scores")
    with torch.no_grad():
        expected = model(batch).numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    state = http.get_json(ports["http"], f"/control/models/{cfg.name}")
    assert state["mode"] == "pipeline"
    assert state["stages"]["sparse"]["workers"] == 1 and state["stages"]["dense"]["workers"] == 1


def test_sigterm_drains_in_flight_queries(pipeline_server):
    proc, ports, config, lines, reader = pipeline_server
    cfg = config.models[0]
    model = build_worker_model(cfg)
    batch = sample_batch(model, 1024, rng=1)
    results: list[str] = []

    def send() -> None:
        client = http.triton(ports["http"], network_timeout=120)
        try:
            # a client deadline of 60 s: behind each other these 1024-item queries wait longer than the model's
            # default deadline (2 x its 20 ms SLA), past which a query still queued is answered 504
            out = client.infer(cfg.name, http_inputs(batch), timeout=60_000_000).as_numpy("scores")
            results.append("ok" if out.shape == (1024, 1) else "wrong")
        except Exception as exc:  # noqa: BLE001
            results.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    in_flight = 0
    # SIGTERM only once all four queries were accepted (in flight or already answered): a query that
    # reaches the server after SIGTERM is refused, which is right but not what this test checks
    while time.monotonic() < deadline and in_flight + len(results) < 4:
        in_flight = http.get_json(ports["http"], f"/control/models/{cfg.name}")["in_flight"]
    assert in_flight >= 1, "queries never became in flight"
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(120)
    assert proc.wait(60) == 0, "".join(lines)
    reader.join(30)  # the exit comes before the reader thread has read the last lines of the pipe
    assert results.count("ok") == 4, results
    assert any("draining" in line for line in lines)


def test_serve_needs_a_model_or_config(capsys):
    assert main(["serve"]) == 2
    assert "--config" in capsys.readouterr().err
