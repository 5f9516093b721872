"""Workers SIGKILLed (or SIGSTOPped: ``--stop``) again and again under keep-alive HTTP clients: does every query get
its answer or an explicit error, and never a hang, a reset or another query's answer?

A dead worker's held queries are answered 500 by the supervisor, its idle connections move to another worker
(``serving/node/watchdog.py``).  The races sit between a worker's socket read or write and its next mark of the
connection, microseconds wide: this script kills ``--kills`` times, waits for each restart, and classifies every
query: ``ok`` (the model's scores), ``explicit`` (the 500 naming the dead worker, or with ``--stop`` the 504 naming
the hung one), another error, ``lost`` (a transport failure or a client timeout: the query vanished), ``wrong`` (an
answer with other scores).  A stopped worker is found hung after ``--hang-timeout-s``, its held queries answered
504, and it is killed and replaced.  Run it beside CPU hogs to widen the races (``python3 -c "while True: pass" &``).

    .venv/bin/python -m benchmarks.stress_worker_kills --kills 60 --interval-s 0.3 [--stop --hang-timeout-s 1]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from benchmarks import harness
from benchmarks.harness import ROOT
from recserve.serving import build_worker_model, quick_config
from recserve.serving.node.control_client import ControlClient
from recserve.serving.wire.codec import triton_inputs
from recserve.zoo import sample_batch

MODEL, SCALE, ITEMS = "hercules-rmc1", 1e-3, 32


def outcome(client: Any, batch, expected: np.ndarray, timeout_s: float) -> str:
    """One query's fate (see the module's docstring)."""
    try:
        if isinstance(client, tgrpc.InferenceServerClient):
            got = client.infer(MODEL, triton_inputs(tgrpc, batch.as_arrays()), client_timeout=timeout_s)
        else:
            got = client.infer(MODEL, triton_inputs(thttp, batch.as_arrays()))
        got = got.as_numpy("scores")
    except InferenceServerException as exc:
        text = str(exc)
        if "timed out" in text.lower() or "timeout" in text.lower() or "DEADLINE_EXCEEDED" in text:
            return "lost: client timeout"
        if "died" in text or "stopped responding" in text:
            return "explicit"
        if "UNAVAILABLE" in text:  # gRPC: the worker's connection closed under the call (the client may retry)
            return "unavailable"
        return f"error: {text[:120]}"
    except Exception as exc:  # noqa: BLE001 - a transport failure: the query is lost
        return f"lost: {type(exc).__name__}: {str(exc)[:100]}"
    return "ok" if np.allclose(got, expected, rtol=1e-5, atol=1e-6) else "wrong"


def restarted(control: ControlClient, restarts: int, workers: int, timeout_s: float = 120.0) -> bool:
    """Wait until the model counts ``restarts`` restarts and has ``workers`` ready workers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = control.get_model(MODEL)
        detail = state["stages"]["model"]["worker_detail"]
        if state["worker_restarts"] >= restarts and len(detail) == workers and all(w["ready"] for w in detail):
            return True
        time.sleep(0.05)
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=60, help="workers to kill, one at a time (default 60)")
    ap.add_argument("--interval-s", type=float, default=0.3, help="load between a restart and the next kill")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4, help="keep-alive connections, one query at a time each")
    ap.add_argument("--client-timeout-s", type=float, default=20.0,
                    help="a query unanswered this long counts as lost (the node's deadline is 60 s)")
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http",
                    help="http: keep-alive connections; grpc: a tritonclient channel per client (its calls in flight "
                         "when the worker holding its connection dies fail UNAVAILABLE: counted apart)")
    ap.add_argument("--stop", action="store_true", help="SIGSTOP the worker (a hang) instead of SIGKILL")
    ap.add_argument("--hang-timeout-s", type=float, default=1.0,
                    help="the model's hang_timeout_s: a worker silent this long is hung (default 1; the node's is 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "results" / "stress_worker_kills.json"))
    args = ap.parse_args(argv)
    config = quick_config(MODEL, scale=SCALE, workers=args.workers, deadline_ms=60_000,
                          hang_timeout_s=args.hang_timeout_s)
    model = build_worker_model(config.models[0])
    batches = [sample_batch(model, ITEMS, rng=i) for i in range(4)]
    with torch.no_grad():
        expected = [model(b).numpy() for b in batches]
    outcomes: collections.Counter = collections.Counter()
    lock, stop = threading.Lock(), threading.Event()
    pick = random.Random(args.seed)

    def connect(ports: Any) -> Any:
        if args.protocol == "grpc":
            return tgrpc.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
        return thttp.InferenceServerClient(f"127.0.0.1:{ports.http}", connection_timeout=args.client_timeout_s,
                                           network_timeout=args.client_timeout_s)

    def send(i: int, ports: Any) -> None:
        client = connect(ports)
        while not stop.is_set():
            k = i % len(batches)
            i += 1
            fate = outcome(client, batches[k], expected[k], args.client_timeout_s)
            with lock:
                outcomes[fate] += 1
            if fate != "ok" and args.protocol == "http":  # a connection that failed is not reused
                client.close()
                client = connect(ports)
        client.close()

    with harness.node(config) as server:
        control = ControlClient("127.0.0.1", server.ports.http)
        senders = [threading.Thread(target=send, args=(i, server.ports)) for i in range(args.clients)]
        for t in senders:
            t.start()
        killed = 0
        try:
            for k in range(args.kills):
                time.sleep(args.interval_s)
                state = control.get_model(MODEL)
                pid = pick.choice([w["pid"] for w in state["stages"]["model"]["worker_detail"]])
                os.kill(pid, signal.SIGSTOP if args.stop else signal.SIGKILL)
                killed += 1
                if not restarted(control, state["worker_restarts"] + 1, args.workers):
                    print(f"kill {k + 1}: the worker did not come back within 120 s", flush=True)
                    break
                if (k + 1) % 10 == 0:
                    with lock:
                        print(f"kill {k + 1}/{args.kills}: {dict(outcomes)}", flush=True)
        finally:
            stop.set()
            for t in senders:
                t.join(timeout=args.client_timeout_s + 30)
    total = sum(outcomes.values())
    bad = sum(n for fate, n in outcomes.items() if fate.startswith(("lost", "wrong", "error")))  # not UNAVAILABLE
    fates = ", ".join(f"{n} {fate}" for fate, n in outcomes.most_common())
    print(f"{killed} workers {'stopped' if args.stop else 'killed'}, {total} queries: {fates}")
    headline = [harness.row("workers killed", killed), harness.row("queries", total),
                harness.row("answered with the explicit error", outcomes["explicit"]),
                harness.row("lost, wrong or other errors", bad, target=0)]
    harness.write_result(Path(args.out), args, headline,
                         {"killed": killed, "queries": total, "outcomes": dict(outcomes), "bad": bad})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
