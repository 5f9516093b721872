"""HTTP front end (aiohttp): the v2 REST protocol, Triton config/statistics, ``/metrics`` and ``/control``.

Control API (JSON, same port, meant for loopback use by the node resource manager)::

    GET  /control/models                      -> {"models": [state, ...]}
    GET  /control/node                        -> {"cores": [...], "llc": {"supported": bool, "total_ways": w}}
    GET  /control/models/{m}/window?seconds=10&percentile=95
                                              -> {"tail_ms", "qps", "arrival_qps", "completed", "failed", "errors"}
    GET  /control/models/{m}                  -> state (workers per stage with pids, cores, RSS/PSS, llc_ways)
    POST /control/models/{m}/workers          {"workers": n, "cores": [[0],[1]] | [0,1] | null,
                                               "threads": t | null, "stage": "model"|"sparse"|"dense" | null}
    POST /control/models/{m}/sub_batch        {"sub_batch": k}
    POST /control/models/{m}/accelerator      {"min_items": k}  (queries of >= k items go to accelerator workers)
    POST /control/models/{m}/llc              {"ways": w}   -> 501 where resctrl is missing

Control requests are validated field by field (:mod:`recserve.serving.node.control_api`) and, when the node has a
``control_token``, need ``Authorization: Bearer <token>`` (401 otherwise).  Responses name the server
``recserve`` only (aiohttp's default ``Server`` header names Python's and aiohttp's versions).

Model repository (Triton's extension; 501 on a node without ``repository``)::

    POST /v2/repository/index                 {"ready": bool}? -> [{"name", "version", "state", "reason"}, ...]
    POST /v2/repository/models/{m}/load       -> {} once the versions its policy selects serve; 400 naming the file
    POST /v2/repository/models/{m}/unload     -> {}

System shared memory (Triton's extension, ``serving/wire/shm.py``; the control API's access rule)::

    POST /v2/systemsharedmemory/region/{r}/register {"key", "offset", "byte_size"} -> {}
    POST /v2/systemsharedmemory[/region/{r}]/unregister -> {}
    GET  /v2/systemsharedmemory[/region/{r}]/status -> [{"name", "key", "offset", "byte_size"}, ...]
    *    /v2/cudasharedmemory/...             -> 501 (not supported)

Every error, including aiohttp's own (unknown route 404, wrong method 405, body over
``max_body_bytes`` 413, a head it cannot parse: ``node/handover.py``), is answered as
``{"error": "...", "field"?: "..."}`` with ``Content-Type: application/json``, with the status from
:data:`recserve.serving.wire.errors.STATUS`.  Bodies are read whole and decoded by ``node/http_bodies.py``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler  # aiohttp's 100 / 417, used for the rest

from recserve.serving.node import control_api
from recserve.serving.node.http_bodies import CODINGS, UnreadableBody, framing_error, request_body
from recserve.serving.node.llc import LlcUnsupported
from recserve.serving.node.metrics import NodeSnapshot, PrometheusExporter
from recserve.serving.wire import codec, protocol
from recserve.serving.wire.errors import STATUS, InferError
from recserve.serving.wire.shm import CUDA_UNSUPPORTED, register_request

if TYPE_CHECKING:
    from recserve.serving.node.core import NodeCore
    from recserve.serving.node.runtime import ModelRuntime

log = logging.getLogger("recserve.serving")
CLOSING = frozenset({"slow_client", "too_large", "client_gone"})  # error codes whose answer ends the connection


def error_response(exc: InferError) -> web.Response:
    """The JSON error answer; the connection closes after one whose body may still be arriving (408, 413) or
    whose client left, and a 415 names the content codings accepted (RFC 9110 15.5.16)."""
    headers = {"Accept-Encoding": CODINGS} if exc.code == "unsupported_media" else None
    response = web.json_response(exc.body(), status=exc.status.http, headers=headers)
    if exc.code in CLOSING or isinstance(exc, UnreadableBody):
        response.force_close()
    return response


def _ready(data: dict[str, Any], ready: bool) -> web.Response:
    """A readiness answer: the Open Inference Protocol body, 200 when ready and 503 otherwise."""
    return web.json_response({**data, "ready": ready}, status=200 if ready else 503)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def build_app(core: NodeCore) -> web.Application:
    """The node's HTTP application: the v2 protocol, Triton's repository and shared-memory extensions, ``/metrics``
    and the control API, behind the error, access and refusal-counting middlewares."""
    control_api.check_exposure(core.config.host, core.config.control_token)
    app = web.Application(client_max_size=core.config.max_body_bytes,
                          middlewares=[json_errors, refuse_bad_framing, _control_access(core.config.control_token),
                                       _refusal_counter(core)])
    app.on_response_prepare.append(plain_server_header)
    app.on_response_prepare.append(_closing_while_stopping(core))
    routes = web.RouteTableDef()
    for add in (_health_routes, _model_routes, _repository_routes, _shm_routes, _metrics_routes, _control_routes):
        add(routes, core)
    expect = _expect_within(core)
    app.add_routes([web.RouteDef(r.method, r.path, r.handler, {**r.kwargs, "expect_handler": expect})
                    for r in routes if isinstance(r, web.RouteDef)])
    _add_unrouted(app, core)
    return app


def _waits_for_100(request: web.Request) -> bool:
    return request.headers.get("Expect", "").lower() == "100-continue"


def _expect_within(core: NodeCore) -> Any:
    async def expect_continue(request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` with a body over ``max_body_bytes``: 413 at once, without the 100 that would
        have the client send the body first (RFC 9110 10.1.1), as the workers answer; else aiohttp's own (100 to
        an HTTP/1.1 client, 417 for any other expectation)."""
        limit, length = core.config.max_body_bytes, request.content_length
        if length is not None and length > limit and _waits_for_100(request):
            error = InferError("too_large", f"body: {length} bytes exceed the limit of {limit}", "body")
            if request.path.endswith("/infer"):
                core.refused(error.code)
            return error_response(error)
        return await _default_expect_handler(request)

    return expect_continue


def _add_unrouted(app: web.Application, core: NodeCore) -> None:
    """The last route, taking every request no other route takes, with the 404 or 405 aiohttp would give.  It has
    its own Expect handler: aiohttp's answer to an unrouted request comes from a route of its own that sends
    ``100 Continue`` first, asking the client for a body only to refuse it.  Here the refusal is the final status
    instead of the 100 (RFC 9110 10.1.1), and the connection closes (the body it announced is never read)."""
    unrouted = app.router.add_resource("/{unrouted:.*}")
    others = [r for r in app.router.resources() if r is not unrouted]

    async def route_error(request: web.Request) -> web.HTTPException:
        allowed: set[str] = set()
        for resource in others:
            allowed |= (await resource.resolve(request))[1]
        return web.HTTPMethodNotAllowed(request.method, allowed) if allowed else web.HTTPNotFound()

    async def refuse(request: web.Request) -> web.StreamResponse:
        raise await route_error(request)

    async def refuse_before_body(request: web.Request) -> web.StreamResponse | None:
        if not _waits_for_100(request):
            return await _default_expect_handler(request)
        error = await route_error(request)
        if request.path.endswith("/infer"):
            core.refused(str(error.status))
        response = http_error_response(request, error)
        response.force_close()
        return response

    unrouted.add_route("*", refuse, expect_handler=refuse_before_body)


def _refusal_counter(core: NodeCore) -> Any:
    @web.middleware
    async def count_refusals(request: web.Request, handler: Any) -> web.StreamResponse:
        """Inference requests refused before any model counted them (unknown model, bad route), by status."""
        try:
            return await handler(request)
        except Exception as exc:
            if request.path.endswith("/infer") and not getattr(exc, "counted", False):
                code = exc.code if isinstance(exc, InferError) else str(getattr(exc, "status", "internal"))
                core.refused(code)
            raise

    return count_refusals


def _runtime(core: NodeCore, request: web.Request) -> ModelRuntime:
    """The model (and version) a request's path names."""
    return core.runtime(request.match_info["model"], request.match_info.get("version"))


def _health_routes(routes: web.RouteTableDef, core: NodeCore) -> None:
    @routes.get("/v2")
    async def server_metadata(_: web.Request) -> web.Response:
        return _json(protocol.server_metadata(core.config.server_name))

    @routes.get("/v2/health/live")
    async def live(_: web.Request) -> web.Response:
        return _json({"live": True})

    @routes.get("/v2/health/ready")
    async def ready(_: web.Request) -> web.Response:
        return _ready({}, core.ready)

    @routes.get("/v2/models/stats")
    async def all_stats(_: web.Request) -> web.Response:
        return _json(core.statistics())


def _model_routes(routes: web.RouteTableDef, core: NodeCore) -> None:
    """Each model's metadata, readiness, config, statistics and inference, unversioned and by version."""
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        @routes.get(prefix)
        async def metadata(request: web.Request) -> web.Response:
            rt = _runtime(core, request)
            return _json(protocol.model_metadata(rt.name, rt.info, sorted(core.versions.get(rt.name, {}), key=int)))

        @routes.get(prefix + "/ready")
        async def model_ready(request: web.Request) -> web.Response:
            rt = _runtime(core, request)
            return _ready({"name": rt.name}, rt.ready)

        @routes.get(prefix + "/config")
        async def config(request: web.Request) -> web.Response:
            return _json(core.model_config(_runtime(core, request)))

        @routes.get(prefix + "/stats")
        async def stats(request: web.Request) -> web.Response:
            info = request.match_info
            return _json(core.statistics(info["model"], info.get("version", "")))

        @routes.post(prefix + "/infer")
        async def infer(request: web.Request) -> web.Response:
            return await _infer(core, _runtime(core, request), request)


async def _infer(core: NodeCore, rt: ModelRuntime, request: web.Request) -> web.Response:
    """One v2 inference request answered through the node (a model whose workers do not serve HTTP themselves)."""
    try:
        body = await _read(core, request)
        req, arrays = codec.parse_http_infer(body, request.headers.get(codec.HEADER_LENGTH),
                                             core.config.max_json_bytes, core.shm)
    except InferError as exc:
        rt.metrics.refused(exc.code)
        exc.counted = True  # type: ignore[attr-defined]
        raise
    scores = await rt.infer(arrays, codec.request_timeout_s(req))
    payload, headers = codec.http_infer_response(rt.name, req, scores, rt.version, core.shm)
    content_type = headers.pop("Content-Type")
    return web.Response(body=payload, headers=headers, content_type=content_type)


def _repository_routes(routes: web.RouteTableDef, core: NodeCore) -> None:
    """Triton's model-repository extension."""
    @routes.post("/v2/repository/index")
    async def repository_index(request: web.Request) -> web.Response:
        body = await _body(core, request) if request.body_exists else {}
        ready = body.get("ready", False)
        if not isinstance(ready, bool):  # "false" is no false
            raise InferError("invalid", f"ready: expected true or false, got {ready!r}", "ready")
        return _json(core.loader.index(ready))

    @routes.post("/v2/repository/models/{model}/load")
    async def repository_load(request: web.Request) -> web.Response:
        body = await _body(core, request) if request.body_exists else {}
        parameters = body.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InferError("invalid", f"parameters: expected a JSON object, got {parameters!r}", "parameters")
        protocol.check_load_parameters(parameters)
        await core.loader.load(request.match_info["model"])
        return _json({})

    @routes.post("/v2/repository/models/{model}/unload")
    async def repository_unload(request: web.Request) -> web.Response:
        await core.loader.unload(request.match_info["model"])
        return _json({})


def _shm_routes(routes: web.RouteTableDef, core: NodeCore) -> None:
    """Triton's system shared-memory extension (``serving/wire/shm.py``); CUDA shared memory answers 501."""
    @routes.get("/v2/systemsharedmemory/status")
    @routes.get("/v2/systemsharedmemory/region/{region}/status")
    async def shm_status(request: web.Request) -> web.Response:
        return _json(core.shm.status(request.match_info.get("region", "")))

    @routes.post("/v2/systemsharedmemory/region/{region}/register")
    async def shm_register(request: web.Request) -> web.Response:
        core.shm.register(request.match_info["region"], *register_request(await _body(core, request)))
        return _json({})

    @routes.post("/v2/systemsharedmemory/unregister")
    @routes.post("/v2/systemsharedmemory/region/{region}/unregister")
    async def shm_unregister(request: web.Request) -> web.Response:
        core.shm.unregister(request.match_info.get("region", ""))
        return _json({})

    @routes.route("*", "/v2/cudasharedmemory{tail:(/.*)?}")
    async def cuda_shm(_: web.Request) -> web.Response:
        raise InferError("unsupported", CUDA_UNSUPPORTED)

    @routes.route("*", "/v2/trace/setting")
    @routes.route("*", "/v2/models/{model}/trace/setting")
    async def trace_settings(_: web.Request) -> web.Response:
        raise InferError("unsupported", protocol.TRACE_UNSUPPORTED)

    @routes.route("*", "/v2/logging")
    async def log_settings(_: web.Request) -> web.Response:
        raise InferError("unsupported", protocol.LOGGING_UNSUPPORTED)


def _metrics_routes(routes: web.RouteTableDef, core: NodeCore) -> None:
    exporter = PrometheusExporter(lambda: metric_snapshot(core))

    @routes.get("/metrics")
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=exporter.render(), headers={"Content-Type": exporter.content_type})


def _control_routes(routes: web.RouteTableDef, core: NodeCore) -> None:
    """The control API (module docstring), each request's fields checked by ``control_api``."""
    @routes.get("/control/models")
    async def control_models(_: web.Request) -> web.Response:
        return _json({"models": [rt.state() for rt in core.models.values()]})

    @routes.get("/control/node")
    async def control_node(_: web.Request) -> web.Response:
        return _json(core.node_state())

    @routes.get("/control/models/{model}/window")
    async def control_window(request: web.Request) -> web.Response:
        rt = _runtime(core, request)
        seconds, percentile = control_api.window_query(request.query, rt.sla_percentile)
        return _json(rt.metrics.window(seconds, percentile))

    @routes.get("/control/models/{model}")
    async def control_model(request: web.Request) -> web.Response:
        return _json(_runtime(core, request).state())

    @routes.post("/control/models/{model}/workers")
    async def control_workers(request: web.Request) -> web.Response:
        rt = _runtime(core, request)
        ask = control_api.workers_request(await _body(core, request), sorted(rt.pools))
        return _json(await rt.set_workers(ask.workers, ask.cores, ask.threads, ask.stage, ask.replace))

    @routes.post("/control/models/{model}/sub_batch")
    async def control_sub_batch(request: web.Request) -> web.Response:
        rt = _runtime(core, request)
        ask = control_api.sub_batch_request(await _body(core, request), rt.cfg.max_batch_size)
        return _json(await rt.set_sub_batch(ask))

    @routes.post("/control/models/{model}/accelerator")
    async def control_accelerator(request: web.Request) -> web.Response:
        rt = _runtime(core, request)
        k = control_api.accelerator_request(await _body(core, request), rt.cfg.max_batch_size)
        return _json(await rt.set_min_items(k))

    @routes.post("/control/models/{model}/llc")
    async def control_llc(request: web.Request) -> web.Response:
        rt = _runtime(core, request)
        return _json(core.set_llc_ways(rt, control_api.llc_request(await _body(core, request))))


async def _read(core: NodeCore, request: web.Request) -> bytes:
    """A request's body, whole and decoded (``http_bodies``), within the node's read timeout and body limit."""
    return await request_body(request, core.config.read_timeout_s, core.config.max_body_bytes)


async def _body(core: NodeCore, request: web.Request) -> dict:
    try:
        body = json.loads(await _read(core, request))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InferError("invalid", f"body: not valid JSON: {exc}", "body") from exc
    if not isinstance(body, dict):
        raise InferError("invalid", "body: expected a JSON object", "body")
    return body


def _control_access(token: str | None) -> Any:
    """Middleware: the paths of ``control_api.GUARDED_HTTP`` need the node's bearer token when it has one."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        what = control_api.guarded_http(request.path) if token else None
        if what is not None:
            control_api.require_token(what, request.headers.get("Authorization"), token)
        return await handler(request)

    return check


def _closing_while_stopping(core: NodeCore) -> Any:
    """Once the node drains, every answer says ``Connection: close`` (as the workers' do): a keep-alive client sends
    its next query on a new connection, not on this one, which the node closes as it stops."""

    async def closing(_: web.Request, response: web.StreamResponse) -> None:
        if core.stopping:  # the hook runs after aiohttp wrote its Connection header: both are set here
            response.force_close()
            response.headers["Connection"] = "close"

    return closing


async def plain_server_header(_: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = "recserve"


@web.middleware
async def refuse_bad_framing(request: web.Request, handler: Any) -> web.StreamResponse:
    """A request whose framing the workers would refuse is refused here too, and its connection closed."""
    error = framing_error(request)
    if error is None:
        return await handler(request)
    response = error_response(error)
    response.force_close()
    return response


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure as a JSON error body (clients such as KServe's parse it)."""
    try:
        return await handler(request)
    except InferError as exc:
        return error_response(exc)
    except LlcUnsupported as exc:
        return web.json_response({"error": str(exc), "supported": False}, status=STATUS["unsupported"].http)
    except json.JSONDecodeError as exc:
        return error_response(InferError("invalid", f"body: {exc}", "body"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return http_error_response(request, exc)
    except Exception as exc:  # a bug: still a JSON answer, and the traceback in the log
        log.exception("unexpected error answering %s %s", request.method, request.path)
        return error_response(InferError("internal", f"{type(exc).__name__}: {exc}"))


def http_error_response(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's error (404, 405 with its Allow, 413 ...) as a JSON error body."""
    allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
    return web.json_response({"error": f"{exc.reason}: {request.method} {request.path}"}, status=exc.status,
                             headers=allow)


def metric_snapshot(core: NodeCore) -> NodeSnapshot:
    """What ``/metrics`` exports: each loaded version's counters, queries in flight and ready workers per stage,
    and the node's refusals before a model was known."""
    return {
        (rt.name, rt.version): (rt.metrics, rt.in_flight, {s: p.ready_count() for s, p in rt.pools.items()})
        for rt in core.all_runtimes()
    }, core.refusals
