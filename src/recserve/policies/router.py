"""Live query router: an Open Inference Protocol (KServe v2) HTTP front end over several node servers.

Clients send ``POST /v2/models/{model}/infer`` exactly as to a node server.  The router reads the
query's batch size from the request's JSON header (the node server's numpy-only codec: the router
imports neither torch nor the worker machinery, and leaves full validation to the backend), puts the
query in its central queue and asks a dispatch policy (:mod:`recserve.policies.dispatch`, the same
objects the simulator runs, through the same :class:`~recserve.policies.dispatcher.Dispatcher`) which
idle backend instance serves it.  Each backend *slot* is one
instance serving one query at a time (Kairos Sec. 6); the measured round trip teaches the policy's
latency predictor.  The backend's response (status, headers, body) is returned unchanged.

Pool file (YAML)::

    qos_ms: 50            # p99 target the policy plans for
    policy: kairos        # kairos | ribbon | drs | clockwork
    drs_threshold: 300    # for drs: queries larger than this go to base types
    queue_limit: 1024     # queries waiting for a backend slot; past it 503 + Retry-After
    deadline_ms: 100      # a query waiting longer for a slot is answered 504 (default 2 x qos_ms)
    prior:                # optional: seed the latency predictor from measured latency_vs_batch tables
      profiles: profiles/backends.json   # tables whose server name is the backend type
      model: kairos-wnd
    backends:
      - {url: http://127.0.0.1:8001, type: fast, slots: 1, base: true}
      - {url: http://127.0.0.1:8002, type: slow, slots: 1}
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import numpy as np
from aiohttp import web
from pydantic import Field

from recserve.errors import RecserveError, SpecError
from recserve.measure.http_client import Endpoint, HttpClientError, HttpPool, encode_post
from recserve.policies.dispatch import DispatchPolicy, Instance, Query, make_instances, make_policy
from recserve.policies.dispatcher import Dispatcher
from recserve.policies.front_door import LIMITS, STOP_GRACE_S, FrontDoor
from recserve.policies.predictor import LatencyPredictor, prior_from_profiles
from recserve.schema import Schema, integer, number
from recserve.serving.node.config import DEADLINE_SLA_FACTOR
from recserve.serving.node.http import error_response, json_errors, plain_server_header, refuse_bad_framing
from recserve.serving.node.http_bodies import request_body
from recserve.serving.wire import protocol
from recserve.serving.wire.codec import HEADER_LENGTH, batch_size_of
from recserve.serving.wire.errors import InferError
from recserve.specs import read_yaml

FORWARD_HEADERS = ("Content-Type", HEADER_LENGTH)  # a query's headers sent on to its backend
ANSWER_HEADERS = (*FORWARD_HEADERS, "Retry-After")  # a backend's answer's headers given back to the client
ROUTER_EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration"]  # no repository, no shared memory
log = logging.getLogger("recserve.router")
READY_TIMEOUT_S = 2.0  # one backend's answer to a readiness probe: probes time out in a few seconds
DOWN_FIRST_S, DOWN_MOST_S = 1.0, 30.0  # an unreachable backend's first time out of service, and the most (doubling)
QUEUE_LIMIT = 1024  # queries waiting for a backend slot, by default
LATENCY_WINDOW = 65_536  # the latest answered queries whose latencies the router's percentiles read


class BackendUnreachable(Exception):
    """No answer came from a backend (refused, reset, closed, timed out): ``retry`` where another may answer it."""

    def __init__(self, error: BaseException, retry: bool = True) -> None:
        super().__init__(str(error))
        self.error, self.retry = error, retry


@dataclass
class Backend:
    url: str
    type: str
    slots: int = 1
    base: bool = False


@dataclass
class PoolConfig:
    backends: list[Backend]
    qos_ms: float
    policy: str = "kairos"
    drs_threshold: int = 300
    prior: dict[str, np.ndarray] | None = None  # backend type -> mean latency per predictor bucket
    queue_limit: int = QUEUE_LIMIT  # queries waiting for a slot; past it 503
    deadline_ms: float | None = None  # a query waiting longer for a slot is answered 504; None: 2 x qos_ms

    def deadline(self) -> float:
        """Milliseconds a query may wait for a backend slot (the node's default rule: twice the target)."""
        return self.deadline_ms if self.deadline_ms is not None else DEADLINE_SLA_FACTOR * self.qos_ms

    def instance_pool(self) -> tuple[list[str], list[str]]:
        """(type per instance, url per instance): each slot is one instance."""
        types, urls = [], []
        for b in self.backends:
            types += [b.type] * b.slots
            urls += [b.url.rstrip("/")] * b.slots
        return types, urls

    def make_policy(self, name: str | None = None) -> DispatchPolicy:
        name = name or self.policy
        base = [b.type for b in self.backends if b.base] or [self.backends[0].type]
        types = list(dict.fromkeys(b.type for b in self.backends))
        predictor = LatencyPredictor(types, prior=self.prior) if self.prior else None
        return make_policy(name, self.qos_ms, threshold=self.drs_threshold, base_types=base, predictor=predictor)


class BackendFile(Schema):
    url: str
    type: str | None = None  # default b<index>
    slots: integer(1) = 1
    base: bool = False


class PriorFile(Schema):
    profiles: str  # a ProfileSet file with latency_vs_batch tables whose server name is the backend type
    model: str


class PoolFile(Schema):
    """A pool file (module docstring)."""

    qos_ms: number(gt=0)
    backends: list[BackendFile] = Field(min_length=1)
    policy: Literal["kairos", "ribbon", "drs", "clockwork"] = "kairos"
    drs_threshold: integer(0) = 300
    prior: PriorFile | None = None
    queue_limit: integer(1) = QUEUE_LIMIT
    deadline_ms: number(gt=0) | None = None


def load_pool(path: str | Path) -> PoolConfig:
    found = PoolFile.parse(read_yaml(path), str(path))
    backends = []
    for i, b in enumerate(found.backends):
        try:
            Endpoint.parse(b.url)
        except ValueError as exc:
            raise SpecError(f"{path}: backends[{i}].url: {exc}") from None
        backends.append(Backend(b.url, b.type if b.type is not None else f"b{i}", b.slots, b.base))
    prior = None
    if found.prior is not None:
        from recserve.profiles import ProfileSet

        types = [b.type for b in backends]
        prior = prior_from_profiles(ProfileSet.load(found.prior.profiles), found.prior.model, types)
        if not prior:
            raise SpecError(f"{path}: {found.prior.profiles} has no latency_vs_batch table of {found.prior.model!r} "
                            f"on any backend type {sorted(set(types))}")
    return PoolConfig(backends, found.qos_ms, found.policy, found.drs_threshold, prior, found.queue_limit,
                      found.deadline_ms)


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


def summed_stats(entries: list[dict]) -> list[dict]:
    """Triton ``model_stats`` entries of one model version from several nodes as one: counts and durations added,
    the latest ``last_inference`` kept."""
    merged: dict[tuple[str, str], dict] = {}
    for entry in entries:
        key = (str(entry.get("name")), str(entry.get("version")))
        merged[key] = _summed(merged[key], entry) if key in merged else entry
    return list(merged.values())


def _summed(a: Any, b: Any, key: str = "") -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _summed(a[k], b[k], k) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    numbers = isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool)
    if not numbers:
        return a  # names, versions, batch_stats: the first node's
    return max(a, b) if key == "last_inference" else a + b


def model_target(model: str, version: str = "") -> str:
    """A model (and version) as the path segments of a backend's URL, every byte outside unreserved characters
    percent-encoded: a name a client sent can neither add a request (CR LF), climb out of ``/v2/models`` (``../``)
    nor fail to encode."""
    return quote(model, safe="") + (f"/versions/{quote(version, safe='')}" if version else "")


def forwarded(headers: Any) -> dict[str, str]:
    """The query's headers its backend reads (``FORWARD_HEADERS``), those whose value is printable ASCII: one with
    other bytes is not sent (a query is never lost to a header it could not encode)."""
    return {k: v for k in FORWARD_HEADERS if (v := headers.get(k)) is not None and v.isascii() and v.isprintable()}


def describe_failures(failed: list[tuple[str, BaseException | str]]) -> str:
    """Each backend that failed, and how."""
    return "; ".join(f"backend {endpoint}: {_how(why)}" for endpoint, why in failed)


def _how(why: BaseException | str) -> str:
    """A reason as given, or an error's type and its message, where it has one."""
    if isinstance(why, str):
        return why
    return type(why).__name__ + (f" ({why})" if str(why) else "")


def refusal(error: InferError, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict]:
    """A query the router answers itself: (status, JSON body, headers), as ``submit`` returns a backend's answer."""
    return error.status.http, json.dumps(error.body()).encode(), {"Content-Type": "application/json",
                                                                   **(headers or {})}


def backend_error(failed: list[tuple[str, BaseException | str]]) -> bytes:
    """A 502's JSON body naming each backend that failed, and how."""
    return json.dumps({"error": describe_failures(failed)}).encode()


def router_app(pick: Callable[[str], Router | None], routers: list[Router], stats: Callable[[], Any],
               name: str, served: list[str] | None = None) -> web.Application:
    """The Open Inference Protocol over HTTP in front of routers: ``pick(model)`` is the router a model's queries
    and metadata requests go to (None: 404 naming the served models); health is the app's own."""
    app = web.Application(client_max_size=LIMITS.max_body_bytes, middlewares=[json_errors, refuse_bad_framing])
    app.on_response_prepare.append(plain_server_header)

    def unknown(model: str) -> web.Response:
        names = f"; served: {', '.join(served)}" if served else ""
        return error_response(InferError("not_found", f"model {model!r} is not served here{names}"))

    def routed(request: web.Request) -> tuple[Router | None, str]:
        """The router of the model a request names (None: not served here) and the model's backend path segments."""
        model = request.match_info["model"]
        return pick(model), model_target(model, request.match_info.get("version", ""))

    async def infer(request: web.Request) -> web.Response:
        router, target = routed(request)
        if router is None:
            return unknown(request.match_info["model"])
        body = await request_body(request, LIMITS.read_timeout_s, LIMITS.max_body_bytes)
        size = batch_size_of(body, request.headers.get(HEADER_LENGTH))
        status, payload, out = await router.submit(target, body, forwarded(request.headers), size)
        return web.Response(status=status, body=payload, headers=out)

    def proxy_get(tail: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def get(request: web.Request) -> web.Response:
            router, target = routed(request)
            if router is None:
                return unknown(request.match_info["model"])
            return await router.backend_get(f"/v2/models/{target}{tail}")
        return get

    async def model_stats(request: web.Request) -> web.Response:
        router, target = routed(request)
        if router is None:
            return unknown(request.match_info["model"])
        return stats_answer(*await router.backend_stats(f"/v2/models/{target}/stats"))

    async def all_stats(_: web.Request) -> web.Response:
        """Every model's statistics: each router's models' (a fleet's: its one model's) summed over its nodes."""
        paths = [f"/v2/models/{model_target(r.model)}/stats" if r.model else "/v2/models/stats" for r in routers]
        answers = await asyncio.gather(*(r.backend_stats(path) for r, path in zip(routers, paths, strict=True)))
        return stats_answer([e for entries, _ in answers for e in entries], [f for _, fs in answers for f in fs],
                            every=True)

    def stats_answer(entries: list[dict], failed: list, every: bool = False) -> web.Response:
        """The summed statistics; a 502 naming each node where none answered (with ``every``: where some failed)."""
        if failed and (every or not entries):
            return web.Response(status=502, body=backend_error(failed), content_type="application/json")
        return web.json_response({"model_stats": entries})

    async def live(_: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(_: web.Request) -> web.Response:
        """Ready while some model has a ready backend, naming those that have none: one model's outage must not take
        the front door (a Kubernetes Service's endpoints) away from the others; each model's own readiness is
        ``/v2/models/{m}/ready``."""
        reasons = await asyncio.gather(*(router.unready_reason() for router in routers))
        unready = [(f"model {router.model}: " if router.model else "") + reason
                   for router, reason in zip(routers, reasons, strict=True) if reason is not None]
        if len(unready) == len(routers):
            return web.json_response({"ready": False, "error": "no backend is ready: " + "; ".join(unready)},
                                     status=503)
        return web.json_response({"ready": True, **({"unready": "; ".join(unready)} if unready else {})})

    async def server_metadata(_: web.Request) -> web.Response:
        return web.json_response(protocol.server_metadata(name, ROUTER_EXTENSIONS))

    async def router_stats(_: web.Request) -> web.Response:
        return web.json_response(stats())

    async def on_startup(_: web.Application) -> None:
        for router in routers:
            await router.open()

    async def on_cleanup(_: web.Application) -> None:
        for router in routers:
            await router.close()

    app.router.add_post("/v2/models/{model}/infer", infer)
    app.router.add_post("/v2/models/{model}/versions/{version}/infer", infer)
    app.router.add_get("/v2", server_metadata)
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/models/stats", all_stats)
    for tail in ("", "/ready", "/config"):
        app.router.add_get("/v2/models/{model}" + tail, proxy_get(tail))
        app.router.add_get("/v2/models/{model}/versions/{version}" + tail, proxy_get(tail))
    app.router.add_get("/v2/models/{model}/stats", model_stats)
    app.router.add_get("/v2/models/{model}/versions/{version}/stats", model_stats)
    app.router.add_get("/router/stats", router_stats)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


class RouterThread:
    """Run a router (a :class:`Router` or a ``FleetRouter``: anything with ``app()``) on 127.0.0.1 in a background
    thread; ``port`` and ``url`` after ``start``."""

    def __init__(self, router: Any, port: int = 0, host: str = "127.0.0.1") -> None:
        self.router, self.host, self.port = router, host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._door: FrontDoor | None = None
        self._thread = None

    def start(self) -> int:
        import threading

        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._serve())
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="recserve-router")
        self._thread.start()
        ready.wait(30)
        if failure:
            raise RecserveError(f"router failed to start: {failure[0]}")
        return self.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _serve(self) -> None:
        self._door = FrontDoor(self.router.app(), self.host, self.port)
        self.port = await self._door.start()

    def stop(self) -> None:
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._door.stop(), self._loop)
        try:
            fut.result(timeout=STOP_GRACE_S + 10)
        except TimeoutError:
            log.warning("router: not stopped within %.0f s; closing its loop", STOP_GRACE_S + 10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30)
            self._loop = None  # stopped: a second stop is a no-op
