"""The gRPC graceful close under fire: grpcio clients call while every connection is closed again and again.

A worker that retires and the node's cover that stops both close their gRPC connections with GOAWAY
(``serving/transport/h2grpc.py``, ``GrpcConnection.close_gracefully``).  A call whose HEADERS cross the final GOAWAY is
refused and grpc-core retries it once, transparently, if its messages fit the call's retry buffer (256 KiB by
default; a larger call fails at once); a call crossing twice fails ("Stream removed (GOAWAY
received)"), as ``test_changing_workers_under_load_loses_no_query[grpc]`` once did in CI.  This script counts,
for ``--closes`` rounds ``--gap-ms`` apart, the calls answered, the streams refused after a final GOAWAY
(crossings) and every failure by code and message, and writes JSON.  Every call should be answered.

    .venv/bin/python -m benchmarks.stress_grpc_goaway --threads 8 --closes 500 --gap-ms 20 \
        [--in-flight 4 --message-kb 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import threading
from pathlib import Path

import grpc

from benchmarks import harness
from benchmarks.harness import ROOT
from recserve.serving.node.server import listening_socket
from recserve.serving.transport import h2grpc
from recserve.serving.worker import eventloop

Counts = collections.Counter


REFUSED = "refused after the final GOAWAY"


class CountingConnection(h2grpc.GrpcConnection):
    """Counts the streams that arrive after the final GOAWAY (they are refused: the client retries them)."""

    refused = 0  # on the server's loop only

    def connection_lost(self, exc: Exception | None) -> None:
        CountingConnection.refused += self.h2.refused_streams
        super().connection_lost(exc)


class CountingServer(h2grpc.GrpcServer):
    connection_type = CountingConnection


def echo(path: str) -> h2grpc.Method:
    return h2grpc.Method(unary=lambda call, raw: call.reply(bytes(raw)))


def call_until(port: int, stop: threading.Event, counts: Counts, message: bytes = b"hello",
               in_flight: int = 1, retry_buffer: int = 0) -> None:
    """Calls of ``message`` on one channel, ``in_flight`` at a time, until ``stop``; ``retry_buffer``: the
    channel's ``grpc.per_rpc_retry_buffer_size`` (0: grpc-core's default, 256 KiB)."""
    window, lock = threading.Semaphore(in_flight), threading.Lock()

    def done(future: grpc.Future) -> None:
        exc = future.exception()
        with lock:
            counts["answered" if exc is None else f"{exc.code().name}: {exc.details()}"] += 1
        window.release()

    options = [("grpc.max_send_message_length", 1 << 26), ("grpc.max_receive_message_length", 1 << 26)]
    if retry_buffer:
        options.append(("grpc.per_rpc_retry_buffer_size", retry_buffer))
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        send = channel.unary_unary("/stress.S/Echo")
        while not stop.is_set():
            window.acquire()
            send.future(message, timeout=30).add_done_callback(done)
        for _ in range(in_flight):
            window.acquire()


def total(per_thread: list[Counts]) -> Counts:
    """Every client thread's counts (each thread counts its own: ``+=`` on a shared Counter can lose one) and
    the server's refusals."""
    counts = sum(per_thread, Counts())
    if CountingConnection.refused:
        counts[REFUSED] = CountingConnection.refused
    return counts


async def stress(args: argparse.Namespace) -> dict:
    sock = listening_socket("127.0.0.1", 0)
    server = CountingServer(echo, max(1 << 20, 2 * args.message_kb << 10))
    await server.start(sock)
    stop = threading.Event()
    per_thread = [Counts() for _ in range(args.threads)]
    message = b"x" * (args.message_kb << 10) if args.message_kb else b"hello"
    threads = [threading.Thread(target=call_until, args=(sock.getsockname()[1], stop, counts, message, args.in_flight,
                                                         args.retry_buffer_kb << 10))
               for counts in per_thread]
    for t in threads:
        t.start()
    await asyncio.sleep(0.5)
    closed = 0
    for i in range(args.closes):
        for conn in list(server.connections):
            conn.close_gracefully()
            closed += 1
        await asyncio.sleep(args.gap_ms / 1000)
        if args.progress and i % 100 == 99:
            print(f"  {i + 1}/{args.closes} rounds: {dict(total(per_thread))}", flush=True)
    stop.set()
    await asyncio.get_running_loop().run_in_executor(None, lambda: [t.join() for t in threads])
    await server.stop(grace=1.0)
    counts = total(per_thread)
    failed = sum(n for k, n in counts.items() if k not in ("answered", REFUSED))
    return {"threads": args.threads, "in_flight": args.in_flight, "message_kb": args.message_kb,
            "retry_buffer_kb": args.retry_buffer_kb, "closes": closed,
            "gap_ms": args.gap_ms, "loop": args.loop,
            "counts": dict(counts), "failed": failed}


def headline(result: dict) -> list[dict]:
    """Calls answered and calls failed (target: none) across every graceful close."""
    return [harness.row("gRPC calls answered across graceful closes", result["counts"].get("answered", 0), "calls"),
            harness.row(f"gRPC calls failed across {result['closes']} graceful closes", result["failed"], "calls", 0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=8, help="client threads, each with its own channel")
    parser.add_argument("--closes", type=int, default=500, help="rounds of closing every connection")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="time between rounds")
    parser.add_argument("--in-flight", type=int, default=1, help="calls each channel keeps in flight")
    parser.add_argument("--message-kb", type=int, default=0,
                        help="request size (0: 5 bytes); above 256, grpc-core cannot retry a crossed call")
    parser.add_argument("--retry-buffer-kb", type=int, default=0,
                        help="the clients' grpc.per_rpc_retry_buffer_size (0: grpc-core's 256 KiB)")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the server's event loop")
    parser.add_argument("--progress", action="store_true", help="print the counts every 100 rounds")
    parser.add_argument("--json", type=Path, default=ROOT / "results" / "stress_grpc_goaway.json")
    args = parser.parse_args()
    result = eventloop.run(stress(args), args.loop)
    print(json.dumps(result, indent=1))
    harness.write_result(args.json, args, headline(result), result)
    sys.exit(1 if result["failed"] else 0)


if __name__ == "__main__":
    main()
