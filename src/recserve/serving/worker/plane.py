"""Data plane v2: a model worker accepts, decodes, computes and answers its own model's queries.

Why (issue #14, measured with ``benchmarks/bench_serving_overhead.py`` on a 2-core host): with one front-end
process decoding every query and shipping it to the workers over pipes, the pipe hop alone cost 0.63 ms at
batch 1 and the front end 0.8–2.9 ms of CPU per query, so a node served about one core's worth of queries
whatever its worker count.  Here every worker of a whole-query (``mode: model``) model runs this loop:

- ``ConnectionManager`` (``worker/connections.py``) accepts from the node's listening socket, shares each
  connection's descriptor with the supervisor, sweeps slow clients, moves idle connections and hands off what is
  not this worker's; each connection is an HTTP/1.1 ``Connection`` (``worker/http_connection.py``), and gRPC calls
  come through ``worker/grpc_methods.py``.
- ``WorkerPlane`` (here) decodes and validates a query with the model path (``worker/model_path.py``; a large
  plain-JSON one on a thread of its own, ``worker/json_decoder.py``, so the loop serves on meanwhile), then routes
  it: to an accelerator worker (``offload``: a query of at least its ``min_items`` items; ``worker/accel.py``), to
  a less loaded sibling while this worker is busy (``worker/siblings.py``; both sent by ``worker/forwarding.py``),
  or into this worker's ``AdmissionQueue`` (``worker/admission.py``), which admits it by count and deadline or
  sheds it.
- The queued queries are fused into one forward pass, inline or, for a pass predicted to take
  ``compute_thread_ms`` or more, on the ``ComputeThread`` (``worker/compute_thread.py``) so this loop keeps
  reading, admitting and shedding meanwhile.
- ``Reporter`` (``worker/reporter.py``) batches the query records to the supervisor, beats, publishes this
  worker's load to its siblings and returns free memory after large inputs.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from recserve.serving.wire import codec
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.admission import AdmissionQueue, ModelHeld, Query, Reply
from recserve.serving.worker.compute_thread import ComputeThread
from recserve.serving.worker.connections import ConnectionManager
from recserve.serving.worker.early_refusal import EarlyRefusal
from recserve.serving.worker.failure_log import ModelFailures
from recserve.serving.worker.forwarding import QueryForwarding
from recserve.serving.worker.http_connection import Connection, Request
from recserve.serving.worker.http_responses import error_response, response_bytes
from recserve.serving.worker.json_decoder import JsonDecoder
from recserve.serving.worker.limits import PlaneLimits
from recserve.serving.worker.model_path import ModelPath, as_infer_error
from recserve.serving.worker.reporter import RETIRING_LOAD, Reporter

EXIT_SETTLE_S = 0.02  # a retiring worker exits only if it still has nothing left this long after it first had none


class WorkerPlane(QueryForwarding):
    """The worker's event loop side: routes each decoded query, computes the admitted ones, retires and drains."""

    def __init__(self, loop: asyncio.AbstractEventLoop, model_name: str, model: ModelPath,
                 send: Callable[[Any], None], hand_off: Callable[..., None], limits: PlaneLimits,
                 sub_batch: int, version: str = "1", default: bool = True,
                 share: Callable[[int], None] | None = None, states: np.ndarray | None = None,
                 loads: np.ndarray | None = None, slot: int = -1, regions: Any = None,
                 active: np.ndarray | None = None) -> None:
        self.loop = loop
        self.model_name = model_name
        self.model = model
        self.limits = limits
        self.sub_batch = sub_batch
        # inputs decoded from immutable bytes (gRPC) are read-only views; torch only reads them: warned once per
        # process, not re-filtered on every pass (``catch_warnings`` per pass also reset the warning caches)
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.retiring = False  # hand every connection to the supervisor, then exit
        self.exit_event = asyncio.Event()
        self._empty_since = 0.0  # when a retiring worker first had nothing left (``maybe_exit`` waits a little more)
        self.model_failures = ModelFailures(model_name, version)  # queries the model failed, logged now and then
        others_held = ModelHeld(loads, slot, RETIRING_LOAD) if loads is not None and slot >= 0 else None
        self.admission = AdmissionQueue(model_name, limits, self._fail, others_held=others_held)
        self.early = EarlyRefusal(self.admission, lambda: self.offload)  # verdicts before a query is read whole
        self.reporter = Reporter(loop, send, self.admission, self.exit_event, regions, loads, slot)
        self.connections = ConnectionManager(self, send, hand_off, share, states, loads, slot, active)
        self.reporter.publish_load(False)
        self.version = version
        self.default = default
        self._paths: set[str] = set()
        self.set_default(default)
        self.offload: Any = None  # an accel.AcceleratorClient when the model has accelerator workers
        self.siblings: Any = None  # a siblings.SiblingClient: idle workers of the model that take a busy one's queries
        self.model_lock = threading.Lock()  # one forward pass at a time (the loop's pipe items take it too)
        self._thread: ComputeThread | None = None
        self.json_decoder = JsonDecoder(loop, lambda body: self.model.decode(body, None))  # large plain JSON

    # ---- set-up ------------------------------------------------------------------------------------
    async def listen(self, sock: socket.socket) -> None:
        self.connections.listen(sock)
        self.loop.call_soon(self.reporter.beat)

    def set_default(self, default: bool) -> None:
        """The unversioned path is answered only by the model's default (newest loaded) version."""
        self.default = default
        prefix = f"/v2/models/{self.model_name}"
        self._paths = {f"{prefix}/versions/{self.version}/infer"} | ({prefix + "/infer"} if default else set())

    def answers(self, version: str) -> bool:
        """Whether a query naming ``version`` ("" = the default) is this worker's (HTTP and gRPC alike)."""
        return version == self.version or (version == "" and self.default)

    def serves(self, method: str, path: str) -> bool:
        return method == "POST" and path.partition("?")[0] in self._paths and self.serves_queries()

    def serves_queries(self) -> bool:
        """Whole queries of this model are answered here (not while sub-batching, nor while retiring unless the node
        drains: a query on a connection it still holds is then refused here, 503 and ``Connection: close``)."""
        return self.sub_batch <= 0 and (not self.retiring or self.admission.draining)

    # ---- routing a query ---------------------------------------------------------------------------
    def admit(self, conn: Connection, req: Request) -> None:
        """An HTTP request: decode and validate it (errors answered at once), then queue it as a query.  A large
        plain-JSON request is judged from its skeleton first under load (``EarlyRefusal.from_json``: refused, it
        costs a tenth of a ms, not the milliseconds of its decode), then, while this worker is busy, decoded on a
        thread of its own (``worker/json_decoder.py``): its numbers are read with the GIL released, so this loop
        starts passes and answers queries meanwhile."""
        header_length = req.headers.get("inference-header-content-length")
        if header_length is None and len(req.body) >= codec.JSON_FAST_BYTES:
            error = self.early.from_json(req.body, req.arrived)
            if error is not None:
                keep = self.keeps(req.keep_alive)
                self.shed(conn, error, keep, req.version)
                conn.answered(keep)
                return
            if self.json_decoder.takes(len(req.body), self.admission.busy()):
                self.json_decoder.submit(req.body, lambda decoded, error: self._queue_decoded(conn, req, decoded,
                                                                                              error))
                return
        try:
            decoded, error = self.model.decode(req.body, header_length), None
        except Exception as exc:  # noqa: BLE001 - an unreadable request is answered; the worker lives on
            decoded, error = None, exc
        self._queue_decoded(conn, req, decoded, error)

    def _queue_decoded(self, conn: Connection, req: Request, decoded: tuple | None, error: Exception | None) -> None:
        """Queue the query ``admit`` decoded (``decoded``: request, arrays, items), or answer why it is none."""
        if error is None:
            request, arrays, items = decoded  # type: ignore[misc]
            try:
                timeout = codec.request_timeout_s(request)
            except Exception as exc:  # noqa: BLE001
                error = exc
        if error is not None:
            refusal = as_infer_error(error)
            self.refused(refusal.code)
            keep = self.keeps(req.keep_alive)
            conn.write(error_response(refusal, close=not keep, version=req.version))
            conn.answered(keep)
            return

        def reply(scores: np.ndarray | None, error: InferError | None) -> None:
            keep = self.keeps(req.keep_alive)
            if error is None:
                try:
                    payload, headers = self.model.encode(request, scores)
                except Exception as exc:  # noqa: BLE001
                    error = as_infer_error(exc)
                else:
                    content_type = headers.pop("Content-Type")
                    conn.write(response_bytes(200, payload, content_type, headers, close=not keep, version=req.version))
            if error is not None:
                extra = {"Retry-After": self.admission.retry_after()} if error.code == "unavailable" else None
                conn.write(error_response(error, close=not keep, extra=extra, version=req.version))
            conn.answered(keep)

        self.enqueue(arrays, items, req.arrived, timeout, reply, forward=False)

    def enqueue(self, arrays: tuple, items: int, arrived: float, timeout_s: float | None, reply: Reply,
                forward: bool = True, owed: bool = False) -> None:
        """Queue a decoded query if it can meet its deadline (the transport's ``timeout_s``, else the model's);
        ``reply`` is called once, with scores or the error.  A sibling worker of the model holding fewer queries than
        this worker's queue counts for may compute it instead (``serving/worker/siblings.py``) if ``forward``: gRPC's
        calls, which one connection brings to one worker.  HTTP/1.1 queries are not forwarded: their connections
        already spread over the workers (one accept queue, idle connections moved), and forwarding them as well
        shed queries at high load (docs/decisions/2026-11-28-grpc-one-channel-scaling.md).  ``owed``: the checks of
        the query's values are still to run (``ModelPath.owed``), here unless a sibling takes it (it checks every
        query it is sent)."""
        admission = self.admission
        deadline = admission.deadline(timeout_s, arrived)
        late = None if timeout_s is None else admission.passed(deadline)
        if late is not None:
            self._fail(reply, arrived, late)
            return
        if self.offload is not None and not admission.draining:  # a model with accelerator workers: route by size
            if owed and not self.checked(arrays, reply):
                return
            owed = False
            if self.offload.takes(items):
                self._offload(arrays, items, arrived, deadline, reply)
                return
            self.reporter.record(("kind", "cpu", items))
        if forward and self.siblings is not None and not admission.draining and \
                self._forward(arrays, items, arrived, deadline, reply, owed):
            return
        if owed and not self.checked(arrays, reply):
            return
        self.enqueue_at(arrays, items, arrived, deadline, reply)

    def checked(self, query: tuple, reply: Reply) -> bool:
        """Run the checks a query's values are owed (``ModelPath.check_owed``); refused, its error is answered."""
        try:
            self.model.check_owed(query)
        except Exception as exc:  # noqa: BLE001 - an invalid query is answered; the worker lives on
            error = as_infer_error(exc)
            self.refused(error.code)
            reply(None, error)
            return False
        return True

    def enqueue_at(self, arrays: tuple, items: int, arrived: float, deadline: float, reply: Reply,
                   forwarded: bool = False, returned: bool = False) -> None:
        """Queue a validated query due by ``deadline`` if admission lets it in (``forwarded``: a sibling sent it,
        and takes it back if it is refused here, so the refusal is not this node's answer to count; ``returned``:
        this worker took it before a sibling gave it back, so a drain begun since does not refuse it; the work ahead
        still may)."""
        admission = self.admission
        try:
            predicted = admission.check(items, deadline, admitted=returned)
        except InferError as exc:
            if forwarded:
                reply(None, exc)
            else:
                self._fail(reply, arrived, exc)
            return
        admission.push(reply, arrived, deadline, arrays, items, predicted)
        self.reporter.publish_load(self.retiring)
        if not admission.running:  # idle: compute now (a loop turn costs ~30 µs); later arrivals queue and fuse
            admission.running = True
            self._run_next()

    def keeps(self, keep_alive: bool) -> bool:
        """Whether a connection stays open after an answer: never while draining, so the answer says ``Connection:
        close`` and the client sends its next request on a new connection, not on one about to be closed."""
        return keep_alive and not self.admission.draining

    def shed(self, conn: Connection, error: InferError, keep_alive: bool, version: str) -> None:
        """Answer a query refused before it was read whole (503 with Retry-After), counted as a failure."""
        def reply(_scores: np.ndarray | None, exc: InferError | None) -> None:
            conn.write(error_response(exc or error, extra={"Retry-After": self.admission.retry_after()},
                                      close=not keep_alive, version=version))

        self._fail(reply, conn.arrived, error)

    def refused(self, code: str) -> None:
        """A request answered with an error before it was a query (unreadable, too large, too slow)."""
        self.reporter.refused(code)

    # ---- computing ---------------------------------------------------------------------------------
    def _run_next(self) -> None:
        """Compute one (fused) pass, then yield to the loop so new requests are read (and admitted) in between.

        A pass the fit predicts at ``compute_thread_ms`` or longer runs on the compute thread and this loop serves
        on meanwhile (``_passed`` continues when it ends)."""
        admission = self.admission
        group = admission.next_group()
        if not group:
            admission.running = False
            self.maybe_exit()
            return
        start = time.perf_counter()
        admission.computing = len(group)
        self.reporter.publish_load(self.retiring)
        items, arrays = sum(q.items for q in group), [q.arrays for q in group]
        service = admission.service
        predicted = service.predict(items)
        limit = self.limits.compute_thread_ms
        if limit >= 0 and service.n >= 1 and predicted * 1e3 >= limit:
            if self._thread is None:
                self._thread = ComputeThread(self.loop, self.model.compute, self.model_lock)
            admission.pass_started, admission.pass_end = start, start + predicted
            self._thread.submit(arrays, lambda scores, error, seconds: self._passed(group, items, start, scores,
                                                                                    error, seconds))
            return
        cpu = time.thread_time() if self.siblings is not None else 0.0  # read only where a LoopLoad wants it
        try:
            with self.model_lock:
                scores = self.model.compute(arrays)
        except Exception as exc:  # noqa: BLE001 - every failure is answered; the worker lives on
            scores, error = None, exc
        else:
            error = None
        if self.siblings is not None:  # computing, not fronting: not counted as the loop's load
            self.siblings.loop_load.computed(time.thread_time() - cpu)
        self._passed(group, items, start, scores, error, time.perf_counter() - start)

    def _passed(self, group: list[Query], items: int, start: float, scores: list[np.ndarray] | None,
                error: Exception | None, seconds: float) -> None:
        """A pass of ``items`` samples ended (inline or on the compute thread): answer its queries (``scores``, or
        ``error`` for all of them), then turn to the next."""
        admission = self.admission
        admission.pass_started = admission.pass_end = 0.0
        if error is not None:
            for q in group:
                self._fail(q.reply, q.arrived, as_infer_error(error), start)
        else:
            done = start + seconds
            admission.service.observe(items, seconds)
            for i, (q, answer) in enumerate(zip(group, scores, strict=True)):
                if isinstance(answer, InferError):  # failed when run alone after its fused pass failed
                    self._fail(q.reply, q.arrived, answer, start)
                    continue
                q.reply(answer, None)
                admission.lateness.observe(time.perf_counter() - q.predicted)
                self.reporter.record(("done", q.items, done - q.arrived, start - q.arrived, seconds, int(i == 0)))
        admission.computing = 0
        self.reporter.publish_load(self.retiring)
        self.loop.call_soon(self._run_next)

    def _fail(self, reply: Reply, arrived: float, exc: InferError, start: float | None = None) -> None:
        self.reporter.record(("failed", exc.code, time.perf_counter() - arrived, start is not None))
        if start is not None and exc.code == "internal":
            self.model_failures.failed(str(exc))
        reply(None, exc)

    # ---- drain, retire, exit -------------------------------------------------------------------------
    def drain(self) -> None:
        """Shutdown: stop accepting, finish what is queued, refuse the rest with 503."""
        self.admission.draining = True
        self.connections.stop_listening()

    def retire(self) -> None:
        """Resize down: stop accepting, finish what is queued, hand idle connections on, then exit."""
        self.retiring = True
        self.reporter.publish_load(True)
        self.connections.stop_listening()
        self.maybe_exit()

    def maybe_exit(self) -> None:
        if not self.retiring:
            return
        admission = self.admission
        if not self.connections.let_idle_go(close=admission.draining) or admission.queue or admission.running:
            self._empty_since = 0.0
            return
        now = time.perf_counter()
        if not self._empty_since or now - self._empty_since < EXIT_SETTLE_S:
            # look again shortly: a connection accepted just before the listener closed becomes a Connection a
            # loop turn or two later, and exiting now would reset it under its client
            self._empty_since = self._empty_since or now
            self.loop.call_later(EXIT_SETTLE_S, self.maybe_exit)
            return
        self.reporter.flush()
        self.exit_event.set()
