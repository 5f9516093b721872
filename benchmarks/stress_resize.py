"""Workers resized again and again under one gRPC channel (tritonclient, four calls in flight), or under four HTTP
keep-alive connections (``--protocol http``): is every call answered?

A resize that retires workers moves the channel's connection with GOAWAY (``serving/transport/h2grpc.py``); the
client reconnects and grpc-core retries a call refused that way once only.  If the new connection reaches another
retiree, its GOAWAY fails the retried call ("Stream removed"): every retiree therefore stops accepting before any
of them closes a connection (``ModelRuntime.set_workers``).  This script runs ``--rounds`` rounds of resizes through
``--sizes`` (a fresh channel each round), counts the calls and every failure by message, and writes JSON.  Run it
beside CPU hogs to widen the races (``python3 -c "while True: pass" &``).

    .venv/bin/python -m benchmarks.stress_resize --rounds 30 --sizes 3,1,3,1,2 [--protocol http]
"""

from __future__ import annotations

import argparse
import collections
import queue
import sys
import threading
import time
from pathlib import Path

import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from benchmarks import harness
from benchmarks.harness import ROOT
from recserve.serving import build_worker_model, quick_config
from recserve.serving.node.control_client import ControlClient
from recserve.serving.wire.codec import grpc_client_options, triton_inputs
from recserve.zoo import sample_batch

MODEL, SCALE, ITEMS, IN_FLIGHT = "hercules-rmc1", 1e-3, 128, 4


def resize_through(control: ControlClient, sizes: list[int], pause_s: float) -> None:
    for n in sizes:
        time.sleep(pause_s)
        control.set_workers(MODEL, n)


def http_round(port: int, control: ControlClient, sizes: list[int], pause_s: float, batch,
               failures: collections.Counter) -> int:
    """The same over HTTP: ``IN_FLIGHT`` keep-alive connections, one query at a time each."""
    stop, sent, lock = threading.Event(), [0], threading.Lock()

    def send() -> None:
        client = thttp.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=120, network_timeout=120)
        while not stop.is_set():
            with lock:
                sent[0] += 1
            try:
                client.infer(MODEL, triton_inputs(thttp, batch.as_arrays()))
            except Exception as exc:  # noqa: BLE001 - counted
                with lock:
                    failures[str(exc)[:160]] += 1
        client.close()

    senders = [threading.Thread(target=send) for _ in range(IN_FLIGHT)]
    for t in senders:
        t.start()
    try:
        resize_through(control, sizes, pause_s)
    finally:
        stop.set()
        for t in senders:
            t.join(timeout=120)
    return sent[0]


def one_round(port_grpc: int, control: ControlClient, sizes: list[int], pause_s: float, batch,
              failures: collections.Counter, channel_args: list | None = None) -> int:
    """Calls kept in flight on one channel while the workers are resized through ``sizes``; returns the calls."""
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{port_grpc}", channel_args=channel_args)
    answers: queue.Queue = queue.Queue()
    window, stop, sent = threading.Semaphore(IN_FLIGHT), threading.Event(), [0]

    def done(result, error) -> None:
        answers.put(error)
        window.release()

    def send() -> None:
        while not stop.is_set():
            window.acquire()
            sent[0] += 1
            client.async_infer(MODEL, triton_inputs(tgrpc, batch.as_arrays()), done)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        resize_through(control, sizes, pause_s)
    finally:
        stop.set()
        sender.join(timeout=60)
    errors = [answers.get(timeout=120) for _ in range(sent[0])]
    client.close()
    failures.update(str(e)[:160] for e in errors if e is not None)
    return sent[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--sizes", default="3,1,3,1,2", help="worker counts each round resizes through, in order")
    ap.add_argument("--pause-s", type=float, default=0.3, help="time between resizes")
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc",
                    help="grpc: one channel, calls in flight; http: keep-alive connections, tritonclient.http")
    ap.add_argument("--recommended-channel", action="store_true",
                    help="gRPC with the channel options recserve recommends (codec.grpc_client_options: a retry "
                         "buffer that holds the ~1 MB query), not tritonclient's defaults")
    ap.add_argument("--out", default=str(ROOT / "results" / "stress_resize.json"))
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    config = quick_config(MODEL, scale=SCALE, workers=2, deadline_ms=60_000)
    batch = sample_batch(build_worker_model(config.models[0]), ITEMS, rng=7)
    failures: collections.Counter = collections.Counter()
    calls = 0
    with harness.node(config) as server:
        control = ControlClient("127.0.0.1", server.ports.http)
        for r in range(args.rounds):
            if args.protocol == "grpc":
                n = one_round(server.ports.grpc, control, sizes, args.pause_s, batch, failures,
                              grpc_client_options() if args.recommended_channel else None)
            else:
                n = http_round(server.ports.http, control, sizes, args.pause_s, batch, failures)
            calls += n
            print(f"round {r + 1}/{args.rounds}: {n} calls, {sum(failures.values())} failed so far", flush=True)
            control.set_workers(MODEL, 2)
    failed = sum(failures.values())
    print(f"{calls} calls over {args.rounds} rounds of resizes {sizes}: {failed} failed")
    for message, count in failures.most_common():
        print(f"  {count} x {message}")
    headline = [harness.row("calls", calls), harness.row("failed calls", failed, target=0)]
    harness.write_result(Path(args.out), args, headline,
                         {"calls": calls, "failed": failed, "failures": dict(failures), "sizes": sizes})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
