"""Large plain-JSON requests decoded off the worker's loop (docs/decisions/2026-11-30-json-decoded-off-the-loop.md).

A 2 MB plain-JSON query takes ~2 ms to decode (its numbers: ``serving/wire/json_numbers.py``).  Decoded on the loop,
it held every answer and the next pass for that long, and admission's learnt lateness grew with it until queries were
refused at a fraction of the worker's CPU.  Here the decode runs on a thread of its own, the numbers read with the GIL
released, and the loop serves on.  Only while the worker has work the decode would hold up (queries queued, a pass in
flight, decodes on the thread): an idle worker decodes on its loop, as a thread hop (~0.1 ms there and back) would
only add to the query's latency.  Only a few at once: past them the loop decodes as before and reads nothing else
meanwhile, so a burst of large queries waits in the sockets and meets early refusal instead of piling up in memory.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from recserve.serving.worker.compute_thread import ComputeThread

# a plain-JSON request of at least this many bytes goes to the thread (~0.25 ms of numbers: the hop, ~50 µs, is then
# small beside what the loop gets back)
JSON_DECODE_THREAD_BYTES = 256 * 1024
JSON_DECODES_AT_ONCE = 2  # given to the thread and not yet back; past them the loop decodes


class JsonDecoder:
    """A worker's thread for large plain-JSON decodes (started at the first); ``decode(body)`` runs on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, decode: Callable[[Any], Any]) -> None:
        self.loop, self.decode = loop, decode
        self.thread: ComputeThread | None = None
        self.in_flight = 0

    def takes(self, size: int, busy: bool) -> bool:
        """Whether a plain-JSON request of ``size`` bytes is decoded here now (else on the loop); ``busy``: the
        worker has queries queued or a pass in flight."""
        return (size >= JSON_DECODE_THREAD_BYTES and (busy or self.in_flight > 0)
                and self.in_flight < JSON_DECODES_AT_ONCE)

    def submit(self, body: Any, done: Callable[[Any, Exception | None], None]) -> None:
        """Decode ``body`` on the thread; ``done(decoded, error)`` is then called on the loop."""
        if self.thread is None:
            self.thread = ComputeThread(self.loop, self.decode, threading.Lock(), name="recserve-json-decode")
        self.in_flight += 1

        def finished(decoded: Any, error: Exception | None, _seconds: float) -> None:
            self.in_flight -= 1
            done(decoded, error)

        self.thread.submit(body, finished)
