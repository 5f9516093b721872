"""Live query router: an Open Inference Protocol (KServe v2) HTTP front end over several node servers.

Clients send ``POST /v2/models/{model}/infer`` exactly as to a node server.  The router reads the
query's batch size from the request's JSON header (the node server's numpy-only codec: the router
imports neither torch nor the worker machinery, and leaves full validation to the backend), puts the
query in its central queue and asks a dispatch policy (:mod:`recserve.policies.dispatch`, the same
objects the simulator runs, through the same :class:`~recserve.policies.dispatcher.Dispatcher`) which
idle backend instance serves it.  Each backend *slot* is one
instance serving one query at a time (Kairos Sec. 6); the measured round trip teaches the policy's
latency predictor.  The backend's response (status, headers, body) is returned unchanged.

This module holds the :class:`Router` (queue, dispatch, backends in and out of service); its pool file is read by
:mod:`~recserve.policies.router_pool`, its HTTP app and thread are :mod:`~recserve.policies.router_http`, and what it
answers itself is :mod:`~recserve.policies.router_answers` (all importable from here, as before).
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from recserve.measure.http_client import Endpoint, HttpClientError, HttpPool, encode_post
from recserve.policies.dispatch import DispatchPolicy, Instance, Query, make_instances
from recserve.policies.dispatcher import Dispatcher
from recserve.policies.router_answers import (
    ANSWER_HEADERS,
    FORWARD_HEADERS,
    backend_error,
    describe_failures,
    forwarded,
    model_target,
    refusal,
    summed_stats,
)
from recserve.policies.router_http import ROUTER_EXTENSIONS, RouterThread, router_app
from recserve.policies.router_pool import QUEUE_LIMIT, Backend, PoolConfig, load_pool
from recserve.serving.wire.errors import InferError

__all__ = ["ANSWER_HEADERS", "FORWARD_HEADERS", "QUEUE_LIMIT", "ROUTER_EXTENSIONS", "Backend", "BackendUnreachable",
           "PoolConfig", "Router", "RouterThread", "Transport", "backend_error", "describe_failures", "forwarded",
           "load_pool", "model_target", "refusal", "router_app", "summed_stats"]
READY_TIMEOUT_S = 2.0  # one backend's answer to a readiness probe: probes time out in a few seconds
DOWN_FIRST_S, DOWN_MOST_S = 1.0, 30.0  # an unreachable backend's first time out of service, and the most (doubling)
LATENCY_WINDOW = 65_536  # the latest answered queries whose latencies the router's percentiles read


class BackendUnreachable(Exception):
    """No answer came from a backend (refused, reset, closed, timed out): ``retry`` where another may answer it."""

    def __init__(self, error: BaseException, retry: bool = True) -> None:
        super().__init__(str(error))
        self.error, self.retry = error, retry


Transport = Callable[[Instance, str, bytes, dict[str, str]], Awaitable[tuple[int, bytes, dict]]]


class Router:
    """The central controller: one :class:`Dispatcher` (queue, policy), instances = backend slots.

    ``transport`` sends one query to one instance (default: HTTP POST to its node server); ``clock``
    returns milliseconds (default: monotonic since start).  Both are parameters so a recorded trace
    can drive the router on a virtual clock (tests compare its decisions with the simulator's)."""

    def __init__(self, pool: PoolConfig, policy: DispatchPolicy | None = None, timeout_s: float = 30.0,
                 transport: Transport | None = None, clock: Callable[[], float] | None = None,
                 record: bool = False, model: str | None = None) -> None:
        self.pool = pool
        self.model = model  # the one model it routes, where it is known (a fleet's); None: whatever clients name
        types, urls = pool.instance_pool()
        self.instances, self.types = make_instances(types, urls)
        self.endpoints = list(dict.fromkeys(urls))  # each distinct backend, in the pool's order
        self.policy = policy or pool.make_policy()
        self.dispatcher = Dispatcher(self.policy, self.instances, self.types, self._start, record=record)
        self.timeout_s = timeout_s
        self.t0 = time.monotonic()
        self.clock = clock or self._monotonic_ms
        self.transport = transport or self._http
        self.session: aiohttp.ClientSession | None = None  # the few GETs proxied to a backend
        self._pools: dict[str, tuple[Endpoint, HttpPool]] = {}  # keep-alive connections per backend, for queries
        self.latencies: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)  # ms, the latest
        self.completed = 0
        self.errors = 0
        self.shed = 0  # queries refused with the queue full (503)
        self.expired = 0  # queries that waited past the deadline for a slot (504)
        self.down: dict[str, float] = {}  # backend URL -> seconds it is out of service for (doubling while it fails)
        self._backoff: dict[str, float] = {}  # backend URL -> its last time out of service, until it answers again
        self._returns: dict[str, asyncio.TimerHandle] = {}  # backend URL -> when it goes back into service

    def _monotonic_ms(self) -> float:
        return (time.monotonic() - self.t0) * 1000.0

    def now_ms(self) -> float:
        return self.clock()

    # ------------------------------------------------------------------ dispatch
    async def submit(self, model: str, body: bytes, headers: dict[str, str], size: int) -> tuple[int, bytes, dict]:
        if self._all_down():
            self.errors += 1
            return 502, backend_error(self._down_reasons()), {"Content-Type": "application/json"}
        if self.waiting() >= self.pool.queue_limit:
            self.errors += 1
            self.shed += 1
            return refusal(InferError("unavailable", f"the router's queue holds {self.pool.queue_limit} queries "
                                                     "waiting for a backend (the pool file's queue_limit); retry "
                                                     "shortly"), {"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        q = self.dispatcher.arrive(self.now_ms(), size, payload=(model, body, headers, fut, []))
        if not fut.done():
            timer = loop.call_later(self.pool.deadline() / 1e3, self._expire, q)
            fut.add_done_callback(lambda _: timer.cancel())
        status, payload, out_headers = await fut
        if status == 200:
            self.completed += 1
            self.latencies.append(self.now_ms() - q.arrival)
        else:
            self.errors += 1
        return status, payload, out_headers

    def waiting(self) -> int:
        """Queries waiting for a backend slot (the central queue and, with Clockwork, the instances' own)."""
        return len(self.dispatcher.queue) + sum(len(inst.local) for inst in self.instances)

    def _expire(self, q: Query) -> None:
        """``q`` waited its deadline: if no slot took it yet, it leaves the queue and is answered 504 (a backend it
        was sent to answers it, within the router's timeout)."""
        if not self.dispatcher.withdraw(q):
            return
        self.expired += 1
        waited = self.now_ms() - q.arrival
        fut = q.payload[3]
        if not fut.done():  # ``submit`` counts it
            fut.set_result(refusal(InferError(
                "deadline", f"waited {waited:.0f} ms for a backend slot, past the router's deadline of "
                            f"{self.pool.deadline():.0f} ms (the pool file's deadline_ms; default 2 x qos_ms)")))

    def _start(self, q: Query, inst: Instance, now: float) -> None:
        asyncio.get_running_loop().create_task(self._forward(q, inst))

    async def _http(self, inst: Instance, model: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, dict]:
        """POST the query to the instance's node server on a keep-alive connection of the load generator's lean
        client (``measure/http_client.py``): it costs the router's thread less CPU per query than aiohttp's client
        (docs/decisions/2026-11-28-one-dispatcher.md)."""
        try:
            endpoint, pool = self._backend(inst.endpoint)
            request = encode_post(f"{endpoint.host}:{endpoint.port}", f"{endpoint.prefix}/v2/models/{model}/infer",
                                  body, headers)
            # the outer bound also covers connecting (a backend that drops SYNs would hold a query for minutes)
            resp = await asyncio.wait_for(pool.send(request, self.timeout_s), self.timeout_s)
        except (HttpClientError, ValueError) as exc:  # ValueError: not an http(s) URL
            raise BackendUnreachable(exc) from exc
        except TimeoutError as exc:  # the client's time is spent: answered, not sent elsewhere
            raise BackendUnreachable(exc, retry=False) from exc
        return resp.status, resp.body, {k: resp.headers[k.lower()] for k in ANSWER_HEADERS
                                        if k.lower() in resp.headers}

    def _backend(self, url: str) -> tuple[Endpoint, HttpPool]:
        if url not in self._pools:
            endpoint = Endpoint.parse(url)
            self._pools[url] = endpoint, endpoint.pool(limit=4096, retry_stale=True)
        return self._pools[url]

    async def _forward(self, q: Query, inst: Instance) -> None:
        model, body, headers, fut, tried = q.payload
        try:
            result = await self.transport(inst, model, body, headers)
        except BackendUnreachable as exc:
            self._unreachable(q, inst, exc)
            return
        now = self.now_ms()
        self._reachable(inst.endpoint)
        self.dispatcher.finish(now, inst)
        if not fut.done():
            fut.set_result(result)
        self.dispatcher.dispatch(now)

    def _unreachable(self, q: Query, inst: Instance, exc: BackendUnreachable) -> None:
        """A backend gave no answer: it leaves service for a while (``DOWN_FIRST_S``, doubling up to ``DOWN_MOST_S``
        while it keeps failing; the policy learns nothing from it), and the query goes to another backend, unless it
        has tried every one, none is in service or its time is spent: then it is answered 502 naming each."""
        now = self.now_ms()
        tried = q.payload[4]
        tried.append((inst.endpoint, exc.error))
        self.dispatcher.fail(inst)
        self._take_out(inst.endpoint)
        if not exc.retry or len({e for e, _ in tried}) == len(self.endpoints) or self._all_down():
            self.dispatcher.withdraw(q)
            self._answer_502(q)
        if self._all_down():  # nothing can serve what waits: answered now, not at the time out
            for waiting in list(self.dispatcher.queue):
                self.dispatcher.withdraw(waiting)
                self._answer_502(waiting)
        self.dispatcher.dispatch(now)

    def _all_down(self) -> bool:
        return len(self.down) == len(self.endpoints)

    def _answer_502(self, q: Query) -> None:
        fut, tried = q.payload[3], q.payload[4]
        if not fut.done():  # ``submit`` counts it
            fut.set_result((502, backend_error(tried + self._down_reasons({e for e, _ in tried})),
                            {"Content-Type": "application/json"}))

    def _down_reasons(self, besides: set[str] = frozenset()) -> list[tuple[str, str]]:
        """Each backend out of service (but those in ``besides``) and when it is tried again."""
        return [(endpoint, f"unreachable; tried again within {s:.0f} s") for endpoint, s in self.down.items()
                if endpoint not in besides]

    def _take_out(self, endpoint: str) -> None:
        if endpoint in self.down:
            return
        self.down[endpoint] = seconds = min(DOWN_MOST_S, self._backoff.get(endpoint, DOWN_FIRST_S / 2) * 2)
        self._backoff[endpoint] = seconds
        for inst in self.instances:
            if inst.endpoint == endpoint:
                self.dispatcher.park(inst)
        self._returns[endpoint] = asyncio.get_running_loop().call_later(seconds, self._put_back, endpoint)

    def _put_back(self, endpoint: str) -> None:
        """A backend's time out of service is over: its instances take queries again (the next is its probe)."""
        if self.down.pop(endpoint, None) is None:
            return
        self._returns.pop(endpoint).cancel()  # a no-op where it is the timer that called
        now = self.now_ms()
        for inst in self.instances:
            if inst.endpoint == endpoint:
                self.dispatcher.restore(now, inst)

    def _reachable(self, endpoint: str) -> None:
        """A backend answered: its back-off starts again from the first, and it is in service if it was not."""
        if self._backoff.pop(endpoint, None) is not None:
            self._put_back(endpoint)

    def stats(self) -> dict[str, Any]:
        lat = np.array(self.latencies) if self.latencies else np.zeros(0)
        return {
            "policy": self.policy.describe(),
            "completed": self.completed,
            "latency_window": len(lat),  # the latest answers the percentiles read
            "errors": self.errors,
            "shed_queue_full": self.shed,
            "expired_waiting": self.expired,
            "queued": self.waiting(),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            "served": {f"{i.index}:{i.type_name}@{i.endpoint}": i.served for i in self.instances},
            "out_of_service_s": dict(self.down),  # backends unreachable, and for how long they are left alone
            "predictor_table_fraction": self.policy.predictor.table_fraction(),
        }

    # ------------------------------------------------------------------ HTTP
    async def open(self) -> None:
        """The client session the few proxied GETs use (on the serving loop)."""
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                             connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        for timer in self._returns.values():
            timer.cancel()
        if self.session is not None:
            await self.session.close()
        for _, pool in self._pools.values():
            pool.close()

    def app(self) -> web.Application:
        return router_app(lambda model: self, [self], self.stats, "recserve-router")

    async def backend_get(self, path: str) -> web.Response:
        """A metadata GET answered by the first backend (in the pool's order) that answers 200, else by the first
        that answers at all: one backend down or still loading does not hide a model; all down is a 502 naming
        each and why."""
        answers = await asyncio.gather(*(self._get(endpoint, path) for endpoint in self.endpoints))
        replies = [a for a in answers if isinstance(a, web.Response)]
        if replies:
            return next((r for r in replies if r.status == 200), replies[0])
        failed = list(zip(self.endpoints, answers, strict=True))
        return web.Response(status=502, body=backend_error(failed), content_type="application/json")

    async def backend_stats(self, path: str) -> tuple[list[dict], list[tuple[str, BaseException | str]]]:
        """Triton statistics (``path``: ``/v2/models[/{m}[/versions/{v}]]/stats``) of every backend that answers,
        each model version's entry summed over them (``summed_stats``), and the backends that did not answer."""
        answers = await asyncio.gather(*(self._get(endpoint, path) for endpoint in self.endpoints))
        entries, failed = [], []
        for endpoint, answer in zip(self.endpoints, answers, strict=True):
            if not isinstance(answer, web.Response) or answer.status != 200:
                failed.append((endpoint, f"HTTP {answer.status}" if isinstance(answer, web.Response) else answer))
                continue
            try:
                entries += json.loads(answer.body)["model_stats"]  # type: ignore[arg-type]
            except (ValueError, KeyError, TypeError) as exc:
                failed.append((endpoint, f"not Triton statistics: {exc}"))
        return summed_stats(entries), failed

    async def unready_reason(self) -> str | None:
        """None while some backend is ready for this router's queries (its model ready, or the node ready where
        the model is not known), else why none is: the router's own readiness (a probe's timeout is short)."""
        path = f"/v2/models/{model_target(self.model)}/ready" if self.model else "/v2/health/ready"
        answers = await asyncio.gather(*(self._get(endpoint, path, READY_TIMEOUT_S) for endpoint in self.endpoints))
        ready = [endpoint for endpoint, a in zip(self.endpoints, answers, strict=True)
                 if isinstance(a, web.Response) and a.status == 200]
        for endpoint in ready:  # back in service at once: ready here and refused by the back-off would disagree
            if endpoint in self.down:
                self._reachable(endpoint)
        if ready:
            return None
        failed = [(endpoint, f"HTTP {a.status}" if isinstance(a, web.Response) else a)
                  for endpoint, a in zip(self.endpoints, answers, strict=True)]
        return describe_failures(failed)

    async def _get(self, endpoint: str, path: str, timeout_s: float | None = None) -> web.Response | BaseException:
        """One backend's answer to a GET, or the error that kept it from answering."""
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        try:
            async with self.session.get(endpoint + path, timeout=timeout) as resp:
                return web.Response(status=resp.status, body=await resp.read(), content_type=resp.content_type)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:  # ValueError: not an http(s) URL
            return exc
