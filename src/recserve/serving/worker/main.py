"""Worker processes: one model replica (or one pipeline stage) pinned to its cores.

Workers are started from a *forkserver* that has imported torch once: forking from it is fast and
safe (the server's asyncio/gRPC threads are never forked), and tensors made shared with
``share_memory_()`` travel to the worker as file descriptors, so every worker of a model reads the
same physical copy of the embedding tables.

Each worker also gets its own shared-memory I/O buffer (a shared uint8 tensor, passed once at
start): large inputs and outputs are copied into it and only their (offset, dtype, shape) travel
on the pipe, because pushing megabytes through a socketpair costs one context switch per socket
buffer (an order of magnitude more than the memcpy on a busy host).  The server writes the input
region only while the worker is idle and copies the output region out before the next item, so one
buffer per worker is enough.

The worker's pipe to the supervisor carries the messages of ``serving/wire/pipe.py`` (ready, heartbeats, batched
query records, connection descriptors, hand-offs, adopt / config / drain) and, for a stage worker, the items the
supervisor sends ``(item_id, arrays_or_None, descriptors_or_None)`` (``None`` = finish and exit) with their replies
``(item_id, ok, result_or_message, compute_s)``, ``result`` an array, a list of arrays, or ``("shm", descriptors)``.
A ``model``-stage worker given the node's listening socket accepts and answers its own model's queries itself
(data plane v2, ``serving/worker/plane.py``); an accelerator worker (stage ``accel``, ``serving/worker/accel.py``)
serves framed queries on a Unix socket.

Stages: ``model`` payload ``(dense, values, lengths)`` -> scores; ``sparse`` same payload -> list
of per-table embeddings; ``dense`` payload ``(dense, [embeddings])`` -> scores.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from recserve import logs
from recserve.errors import RecserveError
from recserve.serving.wire import codec, pipe
from recserve.serving.worker.failure_log import ModelFailures
from recserve.serving.worker.model_path import checked_scores
from recserve.serving.worker.tier_counts import tier_counts
from recserve.specs import get_model
from recserve.zoo import RecModel, build
from recserve.zoo.batch import QueryBatch

STAGES = ("model", "sparse", "dense")
SWITCH_INTERVAL_S = 0.001  # GIL hand-over bound in a v2 worker: its loop answers while the compute thread runs


# table_backend -> "module:function(model_config) -> model", imported in the worker process itself
TABLE_BACKENDS: dict[str, str] = {"elasticrec": "recserve.serving.shards.remote_table:build_dense_shard_model"}


def build_worker_model(model_config: Any) -> RecModel:
    """The one place that turns a served-model config into a runnable model.

    Table backends other than DRAM (ElasticRec shards, SDM tiers) plug in here by looking at
    ``model_config.table_backend`` / ``model_config.options`` and calling ``model.replace_table``.
    """
    backend = getattr(model_config, "table_backend", "dram")
    if backend in TABLE_BACKENDS:
        import importlib

        module, _, function = TABLE_BACKENDS[backend].partition(":")
        return getattr(importlib.import_module(module), function)(model_config)
    if backend != "dram":
        from recserve.errors import SpecError

        raise SpecError(f"model {model_config.name!r}: table_backend {backend!r} is not available")
    model = dram_model(model_config)
    tier = (model_config.options or {}).get("tier")
    if tier:  # SDM: some tables served from SSD files behind DRAM caches (docs/sdm.md)
        from recserve.embedding.tiered import tier_from_config

        tier_from_config(model, tier, f"model {model_config.name!r} tier")
    if getattr(model_config, "fuse_tables", False) and not getattr(model_config, "artifact", ""):
        from recserve.zoo.fused import fusable

        if fusable(model):  # every table in DRAM: one lookup per width (artifacts stay memory-mapped, unfused)
            model.fuse_tables()
    if isinstance(model, RecModel):  # zoo families and safetensors artifacts; exported programs run as they are
        model.direct_layers()
    return model


def dram_model(model_config: Any) -> RecModel:
    """A served model's weights, every table in DRAM: a repository model's own artifact, else the catalogue model
    built at its scale and seed (what ``tier rebuild`` writes SSD-tier files from)."""
    if getattr(model_config, "artifact", ""):  # a repository model: the user's trained weights or program
        from pathlib import Path

        from recserve.zoo.artifacts import load_artifact

        return load_artifact(Path(model_config.artifact), model_config.spec)
    return build(get_model(model_config.model), scale=model_config.scale, seed=model_config.seed)


def share_model(model: RecModel) -> RecModel:
    """Move every parameter and buffer into shared memory (read-only use by all workers)."""
    return model.share_memory()


SHM_MIN_BYTES = 32 * 1024  # smaller payloads go through the pipe: a copy into the buffer is not worth it
Descriptor = tuple[int, str, tuple[int, ...]]  # (offset, numpy dtype str, shape)


@dataclass
class WorkerArgs:
    worker_id: int
    stage: str
    cores: list[int]
    threads: int
    model_config: Any
    io_split: int = 0  # bytes of the I/O buffer reserved for inputs; the rest holds outputs
    # the server's verdicts on native code, as the environment variables its probes read (embedding.uring.PROBE_ENV,
    # embedding.row_index.PROBE_ENV); empty: not probed
    probe_verdicts: dict[str, str] = field(default_factory=dict)
    listen: Any = None  # data plane v2: the node's HTTP listening socket (this worker accepts on it)
    info: Any = None  # the model's ModelInfo (validation without a round trip to the server)
    limits: Any = None  # worker.limits.PlaneLimits: this worker's share of the queue, deadlines, fused-pass size
    sub_batch: int = 0
    grpc_listen: Any = None  # data plane v2: the node's gRPC listening socket; None = gRPC in the server
    event_loop: str = "asyncio"  # data plane v2: the loop this worker runs ("uvloop" once the node's probe passed)
    json_numbers: tuple[str, ...] = ()  # data plane v2: the native readers of JSON tensors (the node's probes)
    grpc_upstream: str = ""  # the server's private gRPC address, for every call this worker does not answer
    version: str = "1"  # the model version this worker serves (repository models)
    default: bool = True  # whether it also answers the unversioned path (the model's newest loaded version)
    slot: int = -1  # this worker's index in its model's shared load array (data plane v2)
    accel_socket: str = ""  # an accelerator worker (stage ``accel``): the Unix socket it serves
    accel_sockets: tuple[str, ...] = ()  # a CPU worker of a model with accelerator workers: where to send large queries
    accel_min_items: int = 0  # ... the queries with at least this many items
    shm_dir: str = ""  # data plane v2: the node's shared-memory registry (serving/wire/shm.py), followed by this worker
    sibling_dir: str = ""  # data plane v2: where the model's workers serve queries forwarded by busy siblings


def pack(arrays: list[np.ndarray], buf: np.ndarray) -> list[Descriptor] | None:
    """Copy ``arrays`` into ``buf`` (64-byte aligned); None if they do not fit or are too small to bother."""
    total = sum(a.nbytes + 64 for a in arrays)
    if total < SHM_MIN_BYTES or total > buf.nbytes:
        return None
    out, offset = [], 0
    for a in arrays:
        a = np.ascontiguousarray(a)
        buf[offset : offset + a.nbytes] = a.reshape(-1).view(np.uint8)
        out.append((offset, a.dtype.str, tuple(a.shape)))
        offset += (a.nbytes + 63) // 64 * 64
    return out


def unpack(descriptors: list[Descriptor], buf: np.ndarray, copy: bool) -> list[np.ndarray]:
    arrays = []
    for offset, dtype, shape in descriptors:
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        a = buf[offset : offset + n].view(dt).reshape(shape)
        arrays.append(a.copy() if copy else a)
    return arrays


def flatten(stage: str, payload: Any) -> list[np.ndarray]:
    if stage == "dense":
        dense, pooled = payload
        return [dense, *pooled]
    return list(payload)


def unflatten(stage: str, arrays: list[np.ndarray]) -> Any:
    if stage == "dense":
        return arrays[0], arrays[1:]
    return tuple(arrays)


def run_stage(model: RecModel, stage: str, payload: Any) -> Any:
    """One stage's pass; its float inputs aligned (``codec.aligned``), so that a query's scores do not depend on
    where its floats lay in the request."""
    if stage == "dense":
        dense, pooled = payload
        return model.dense(torch.from_numpy(codec.aligned(dense)),
                           [torch.from_numpy(codec.aligned(p)) for p in pooled]).numpy()
    dense, values, lengths = payload
    batch = QueryBatch(torch.from_numpy(codec.aligned(dense)), torch.from_numpy(values), torch.from_numpy(lengths))
    if stage == "model":
        return model(batch).numpy()
    return [t.numpy() for t in model.sparse(batch)]


def _io_report(model: RecModel) -> list[dict[str, str]]:
    """Tiered tables' read path (mode, I/O engine and why), for the server to report; [] for DRAM models."""
    from recserve.embedding.tiered import io_report

    return io_report(model)


def _refuse_unservable(model: RecModel) -> None:
    """A model shipped with tiered tables whose files changed or broke since the server opened them: the reason,
    raised where the worker says it to the supervisor."""
    from recserve.embedding.tiered import open_errors

    errors = open_errors(model)
    if errors:
        raise RecserveError(errors[0])


LOG_LEVEL_ENV = "RECSERVE_LOG_LEVEL"  # ``recserve serve --log-level``, as the workers inherit it


def log_to_stderr(args: WorkerArgs) -> None:
    """Warnings (or only errors, at ``--log-level error``) to stderr with the time, the level and the worker that
    wrote them, as the server's lines read (a forkserver child inherits no logging set-up: its lines would be bare
    messages)."""
    who = f"{args.model_config.name} v{args.version} {args.stage} worker {args.worker_id}"
    who = who.translate(logs.CONTROL).replace("%", "%%")  # a served name is any text: neither a line nor a format
    logs.log_to_stderr(worker_log_level(), f"%(asctime)s %(name)s %(levelname)s [{who}] %(message)s")


def worker_log_level() -> int:
    """Warnings, or the node's level where it is stricter (``LOG_LEVEL_ENV``)."""
    return max(logging.WARNING, logging.getLevelNamesMapping().get(os.environ.get(LOG_LEVEL_ENV, ""), 0))


def _pin(args: WorkerArgs) -> None:
    # The server owns the worker's lifetime (it exits on ``None`` or when its pipe closes): a SIGTERM
    # or Ctrl-C sent to the whole process group must not kill queries the server is still draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.cores:
        os.sched_setaffinity(0, args.cores)
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set by an earlier parallel op: harmless


def worker_main(conn: Any, args: WorkerArgs, shared_model: RecModel | None, io: torch.Tensor | None = None,
                states: torch.Tensor | None = None, loads: torch.Tensor | None = None,
                active: torch.Tensor | None = None) -> None:
    """Entry point of a worker process: pin, build (or adopt the shared model), serve items."""
    log_to_stderr(args)
    _pin(args)
    os.environ.update(args.probe_verdicts)
    try:
        model = shared_model if shared_model is not None else build_worker_model(args.model_config)
        _refuse_unservable(model)
    except RecserveError as exc:  # the user's to fix: said to the supervisor in one line, no traceback
        conn.send(pipe.encode(pipe.Failed(str(exc))))
        sys.exit(1)
    model.eval()
    buf = io.numpy() if io is not None else np.zeros(0, np.uint8)
    in_buf, out_buf = buf[: args.io_split], buf[args.io_split :]
    ready = pipe.encode(pipe.Ready(os.getpid(), _io_report(model)))
    with torch.inference_mode():
        if args.stage == "accel":
            from recserve.serving.worker.accel import serve_accelerator

            sys.setswitchinterval(SWITCH_INTERVAL_S)  # its loop reads and answers while the pass thread runs
            asyncio.run(serve_accelerator(conn, args, model))
            return
        if args.listen is not None:  # ready once it listens: the node answers as soon as every worker is ready
            from recserve.serving.wire import json_numbers
            from recserve.serving.worker import eventloop

            json_numbers.enable(args.json_numbers)

            eventloop.run(_serve(conn, args, model, in_buf, out_buf, ready,
                                 states.numpy() if states is not None else None,
                                 loads.numpy() if loads is not None else None,
                                 active.numpy() if active is not None else None), args.event_loop)
            return
        conn.send(ready)
        failures = ModelFailures(args.model_config.name, str(args.version))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            if msg is None:
                return
            try:
                conn.send(_item(args, model, msg, in_buf, out_buf, failures))
            except (BrokenPipeError, OSError):
                return


def _item(args: WorkerArgs, model: RecModel, msg: Any, in_buf: np.ndarray, out_buf: np.ndarray,
          failures: ModelFailures) -> tuple:
    """Compute one item the server sent over the pipe; the reply to send back (a failure also told ``failures``)."""
    item_id, payload, descriptors = msg
    start = time.perf_counter()
    try:
        if descriptors is not None:
            payload = unflatten(args.stage, unpack(descriptors, in_buf, copy=False))
        result = run_stage(model, args.stage, payload)
        if args.stage == "model":  # whole queries from the server (its gRPC service): checked as the plane checks
            towers = args.info.towers if args.info is not None else args.model_config.model_spec().towers
            result = checked_scores(result, payload[0].shape[0], towers, args.model_config.name)
        arrays = result if isinstance(result, list) else [result]
        packed = pack(arrays, out_buf)
        return (item_id, True, ("shm", packed) if packed is not None else result, time.perf_counter() - start)
    except Exception as exc:  # a bad item must not kill the worker
        failures.failed(f"{type(exc).__name__}: {exc}")
        return (item_id, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - start)


async def _serve(conn: Any, args: WorkerArgs, model: RecModel, in_buf: np.ndarray, out_buf: np.ndarray,
                 ready: tuple, states: np.ndarray | None = None, loads: np.ndarray | None = None,
                 active: np.ndarray | None = None) -> None:
    """Data plane v2: accept and answer this model's queries, and keep serving the server's pipe."""
    from multiprocessing.reduction import send_handle

    from recserve.serving.wire.shm import Regions
    from recserve.serving.worker.model_path import ModelPath
    from recserve.serving.worker.plane import WorkerPlane

    loop = asyncio.get_running_loop()
    server_pid = os.getppid()

    def send(msg: Any) -> None:
        try:
            conn.send(msg)
        except (BrokenPipeError, OSError):
            plane.exit_event.set()

    def hand_off(fd: int, prefix: bytes, to_slot: int | None = None, shared: bool = False) -> None:
        send(pipe.encode(pipe.Handoff(prefix, args.model_config.name, to_slot, fd if shared else -1)))
        send_handle(conn, fd, server_pid)

    def share(fd: int) -> None:
        send(pipe.encode(pipe.Conn(fd)))
        try:
            send_handle(conn, fd, server_pid)
        except OSError:
            plane.exit_event.set()

    # the loop thread waits at most this long for the GIL while the compute thread runs Python (default 5 ms)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    regions = Regions(args.shm_dir) if args.shm_dir else None
    path = ModelPath(args.model_config.name, args.info, args.model_config.max_batch_size, _model_runner(model),
                     args.limits.max_json, args.version, regions)
    siblings = await _serve_siblings(args) if args.sibling_dir and loads is not None and args.slot >= 0 else None
    plane = WorkerPlane(loop, args.model_config.name, path, send, hand_off, args.limits, args.sub_batch,
                        args.version, args.default, share if states is not None else None, states,
                        loads, args.slot, regions, active)
    _attach_peers(plane, args, siblings, loads)
    grpc_stopped = await _serve_grpc(plane, args, regions) if args.grpc_listen is not None else None
    if (counts := tier_counts(model)) is not None:  # an SSD-tiered model: its tier's counters each beat
        plane.reporter.sources.append(counts)
    await plane.listen(args.listen)
    send(ready)
    loop.add_reader(conn.fileno(), _pipe_reader(conn, args, plane, model, in_buf, out_buf, send))
    # uvloop's add_reader makes the descriptor non-blocking; the pipe's messages are read (and the descriptors it
    # carries taken) whole, in blocking calls, once the loop says a message has started to arrive
    os.set_blocking(conn.fileno(), True)
    await plane.exit_event.wait()
    if grpc_stopped is not None:
        await grpc_stopped()  # its calls still in flight (forwarded ones too) are answered before the exit
    plane.reporter.flush()


def _model_runner(model: RecModel) -> Callable[[tuple], np.ndarray]:
    """The model's whole-query pass, in inference mode on whichever thread runs it."""
    def run(payload: tuple) -> np.ndarray:
        if torch.is_inference_mode_enabled():  # on the loop's thread (worker_main entered it): no mode switch per query
            return run_stage(model, "model", payload)
        with torch.inference_mode():  # thread-local: long passes run on the plane's compute thread
            return run_stage(model, "model", payload)

    return run


def _attach_peers(plane: Any, args: WorkerArgs, siblings: Any, loads: np.ndarray | None) -> None:
    """Where the plane may send queries: its siblings (``siblings``: this worker's server of their queries, if it
    serves one) and the model's accelerator workers."""
    if siblings is not None:
        from recserve.serving.worker.siblings import SiblingClient

        siblings.plane = plane
        plane.siblings = SiblingClient(args.model_config.name, args.sibling_dir, args.slot, loads,
                                       args.limits.queue_limit)
        plane.siblings.record = plane.reporter.record
    if args.model_config.accelerator is not None:
        from recserve.serving.worker.accel import AcceleratorClient

        plane.offload = AcceleratorClient(args.model_config.name, list(args.accel_sockets), args.accel_min_items,
                                          args.limits.queue_limit, args.model_config.accelerator.staging_mb << 20)


def _pipe_reader(conn: Any, args: WorkerArgs, plane: Any, model: RecModel, in_buf: np.ndarray, out_buf: np.ndarray,
                 send: Callable[[Any], None]) -> Callable[[], None]:
    """The loop's reader of the server's pipe: ``None`` retires the worker, control messages configure it (an
    adopted connection's descriptor follows its message), and anything else is a pipeline item computed here."""
    from multiprocessing.reduction import recv_handle

    waiting = pipe.waiting(conn)

    def on_pipe() -> None:
        try:
            while waiting():
                msg = conn.recv()
                if msg is None:
                    plane.retire()
                elif pipe.tagged(msg):
                    control = pipe.decode(msg)
                    _control(plane, control, recv_handle(conn) if isinstance(control, pipe.Adopt) else None, send)
                else:
                    with plane.model_lock:  # a pass may be computing on the plane's compute thread
                        reply = _item(args, model, msg, in_buf, out_buf, plane.model_failures)
                    send(reply)
        except (EOFError, OSError):
            plane.exit_event.set()  # the server is gone

    return on_pipe


GRPC_GRACE_S = 5.0


async def _serve_siblings(args: WorkerArgs) -> Any:
    """Serve the queries busy sibling workers forward (``serving/worker/siblings.py``), before this worker publishes its
    load (siblings send only to a worker whose slot shows 0).  None if the socket cannot be made: the worker then
    serves its own queries only."""
    from recserve.serving.worker.siblings import SiblingServer, socket_path

    server = SiblingServer()
    try:
        await server.serve(socket_path(args.sibling_dir, args.slot))
    except OSError as exc:
        logging.getLogger("recserve.serving").warning(
            "worker %s: no sibling socket (%s); it takes no queries from busy siblings", args.worker_id, exc)
        return None
    return server


async def _serve_grpc(plane: Any, args: WorkerArgs, regions: Any) -> Callable[[], Awaitable[None]]:
    """Start this worker's gRPC server (``worker/grpc_methods.py``); it stops taking calls when the worker retires
    or drains.  Returns what to await before exiting: that stop, which waits for the calls in flight."""
    from recserve.serving.worker.grpc_methods import serve_grpc

    server = await serve_grpc(plane, args.grpc_listen, args.grpc_upstream, args.limits.max_body, regions)
    stopping: list[asyncio.Future] = []
    plane.connections.on_stop_accepting.append(server.stop_accepting)
    plane.connections.on_stop_listening.append(
        lambda: stopping.append(asyncio.ensure_future(server.stop(grace=GRPC_GRACE_S))))

    async def stopped() -> None:
        await (stopping[0] if stopping else server.stop(grace=GRPC_GRACE_S))

    return stopped


def _control(plane: Any, msg: pipe.Adopt | pipe.Config | pipe.Drain, fd: int | None,
             send: Callable[[tuple], None]) -> None:
    if isinstance(msg, pipe.Adopt) and fd is not None:
        task = asyncio.ensure_future(plane.connections.adopt(fd, msg.prefix))
        task.add_done_callback(lambda t: t.exception())
    elif isinstance(msg, pipe.Config):
        changes = msg.changes
        plane.sub_batch = int(changes.get("sub_batch", plane.sub_batch))
        if "default" in changes:
            plane.set_default(bool(changes["default"]))
        if plane.offload is not None and "min_items" in changes:
            plane.offload.min_items = int(changes["min_items"])
        if plane.offload is not None and "accel_sockets" in changes:
            plane.offload.set_sockets(list(changes["accel_sockets"]))
        if changes.get("accepting") is False:  # about to retire (``ModelRuntime.set_workers``)
            plane.connections.stop_accepting()
        if msg.seq:
            send(pipe.encode(pipe.Applied(msg.seq)))
    elif isinstance(msg, pipe.Drain):
        plane.drain()

