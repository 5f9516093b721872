"""The serving workers' event loop (issue #14, ``serving/worker/eventloop.py``): uvloop where a probe in a child process
passes, asyncio's own otherwise, chosen by the node config's ``event_loop``; the node serves the same either way."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as thttp

from recserve.errors import SpecError
from recserve.serving import build_worker_model, quick_config
from recserve.serving.node.config import config_from_dict
from recserve.serving.node.control_client import ControlClient
from recserve.serving.worker import eventloop
from recserve.zoo import sample_batch
from tests.support import http
from tests.support.nodes import node_config, started

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

NAME, SCALE = "hercules-rmc1", 1e-3


def http_inputs(batch) -> list:
    out = []
    for name, arr in batch.as_arrays().items():
        x = thttp.InferInput(name, list(arr.shape), {"float32": "FP32", "int64": "INT64", "int32": "INT32"}[
            arr.dtype.name])
        x.set_data_from_numpy(arr)
        out.append(x)
    return out


def loaded_loops(pid: int) -> set[str]:
    """Which event loops' native code process ``pid`` has mapped (uvloop's extension module, when it runs)."""
    with open(f"/proc/{pid}/maps") as f:
        return {"uvloop"} if "uvloop/loop." in f.read() else set()


def serve_and_check(setting: str) -> dict:
    """A node whose config asks ``setting``: its answers equal the in-process model's; returns its state."""
    model = build_worker_model(quick_config(NAME, scale=SCALE).models[0])
    batch = sample_batch(model, 4, rng=5)
    expected = model(batch).detach().numpy()
    config = node_config(NAME, scale=SCALE, workers=1)
    config.event_loop = setting
    with started(config) as server:
        client = http.triton(server.ports.http)
        for _ in range(20):  # keep-alive: the same connection, answered by the worker
            got = client.infer(NAME, http_inputs(batch)).as_numpy("scores")
            assert np.allclose(got, expected, atol=1e-5)
        client.close()
        state = ControlClient("127.0.0.1", server.ports.http).get_model(NAME)
        pids = [w["pid"] for w in state["stages"]["model"]["worker_detail"]]
        state["loaded"] = [loaded_loops(pid) for pid in pids]
    return state


def test_an_unknown_event_loop_is_refused():
    with pytest.raises(SpecError, match="event_loop"):
        config_from_dict({"event_loop": "trio", "models": [{"model": NAME, "scale": SCALE}]})


@pytest.mark.parametrize("setting", ["auto", "asyncio"])
def test_the_workers_run_the_loop_the_node_chose(setting):
    usable = eventloop.probe_uvloop()[0]
    expected = "uvloop" if setting == "auto" and usable else "asyncio"
    state = serve_and_check(setting)
    assert state["event_loop"]["loop"] == expected and state["event_loop"]["asked"] == setting
    assert all(loaded == ({"uvloop"} if expected == "uvloop" else set()) for loaded in state["loaded"])


def test_a_failed_probe_means_asyncio_and_says_why(monkeypatch):
    monkeypatch.setattr(eventloop, "probe_uvloop", lambda: (False, "Illegal instruction"))
    state = serve_and_check("uvloop")
    assert state["event_loop"] == {"loop": "asyncio", "asked": "uvloop",
                                   "why": "uvloop unavailable (Illegal instruction)"}
    assert state["loaded"] == [set()]


def test_the_probe_survives_a_child_that_dies_on_an_illegal_instruction(monkeypatch):
    """What a native wheel built for a newer CPU does (issue #13's io_uring binding): the child dies, not us."""
    monkeypatch.setattr(eventloop, "PROBE_CODE", "import os, signal\nos.kill(os.getpid(), signal.SIGILL)")
    ok, why = eventloop.probe_uvloop.__wrapped__()
    assert not ok and "SIGILL" in why
    assert eventloop.choose("auto")[0] in ("uvloop", "asyncio")  # the cached verdict of the real probe stands
