"""The accelerator tests' node (one model, a ``device: cpu`` accelerator worker on its own core) and its clients,
shared by the accelerator and device-cache tests."""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import numpy as np
import tritonclient.http as thttp

from tests.support import http
from tests.support.nodes import generous
from tests.support.oip_inputs import http_inputs

MIN_ITEMS = 16
FUSE_DELAY_US = 50_000
MODEL = generous({"name": "ncf", "model": "hera-ncf", "scale": 1e-4, "workers": 1, "max_batch_size": 256})
ACCEL_CORE = max(os.sched_getaffinity(0))
ACCEL = {"device": "cpu", "workers": 1, "threads": 1, "min_items": MIN_ITEMS, "fuse_items": 1024,
         "fuse_delay_us": FUSE_DELAY_US, "cores": [ACCEL_CORE]}


def accel_state(port: int) -> dict:
    return http.get_json(port, "/control/models/ncf")["accelerator"]


def accel_state_after(port: int, before: dict, queries: int) -> dict:
    """The state once ``queries`` more queries are counted (workers report in batches, a few ms after answering)
    and, if any went to the accelerator, its passes too; generous: a busy host delays the workers' reports."""
    end = time.monotonic() + 60
    while True:
        state = accel_state(port)
        routed = sum(state["queries"].values()) - sum(before["queries"].values())
        offloaded = state["queries"]["accelerator"] > before["queries"]["accelerator"]
        if (routed >= queries and (not offloaded or state["passes"] > before["passes"])) or time.monotonic() > end:
            return state
        time.sleep(0.02)


async def infer(session: aiohttp.ClientSession, port: int, batch) -> tuple[int, np.ndarray | None]:
    body, header_length = thttp.InferenceServerClient.generate_request_body(http_inputs(batch))
    async with session.post(f"http://127.0.0.1:{port}/v2/models/ncf/infer", data=body,
                            headers={"Inference-Header-Content-Length": str(header_length)}) as r:
        raw = await r.read()
        if r.status != 200:
            return r.status, None
        n = int(r.headers["Inference-Header-Content-Length"])
        shape = json.loads(raw[:n])["outputs"][0]["shape"]
        return 200, np.frombuffer(raw[n:], np.float32).reshape(shape)


def infer_many(port: int, batches: list) -> list[tuple[int, np.ndarray | None]]:
    async def run() -> list:
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(*(infer(s, port, b) for b in batches))

    return asyncio.run(run())
