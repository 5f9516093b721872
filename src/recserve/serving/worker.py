"""Worker processes: one model replica (or one pipeline stage) pinned to its cores.

Workers are started from a *forkserver* that has imported torch once: forking from it is fast and
safe (the server's asyncio/gRPC threads are never forked), and tensors made shared with
``share_memory_()`` travel to the worker as file descriptors, so every worker of a model reads the
same physical copy of the embedding tables.

Wire protocol on the worker's pipe (numpy arrays only, never torch tensors, so nothing is copied
into new shared-memory segments on each request):

- worker -> server: ``("ready", pid)`` once the model is built.
- server -> worker: ``(item_id, payload)``; ``None`` = finish and exit.
- worker -> server: ``(item_id, True, result, compute_s)`` or ``(item_id, False, message, compute_s)``.

Stages: ``model`` payload ``(dense, values, lengths)`` -> scores; ``sparse`` same payload -> list
of per-table embeddings; ``dense`` payload ``(dense, [embeddings])`` -> scores.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from recserve.specs import get_model
from recserve.zoo import RecModel, build
from recserve.zoo.batch import QueryBatch

STAGES = ("model", "sparse", "dense")


def build_worker_model(model_config: Any) -> RecModel:
    """The one place that turns a served-model config into a runnable model.

    Table backends other than DRAM (ElasticRec shards, SDM tiers) plug in here by looking at
    ``model_config.table_backend`` / ``model_config.options`` and calling ``model.replace_table``.
    """
    backend = getattr(model_config, "table_backend", "dram")
    if backend != "dram":
        from recserve.errors import SpecError

        raise SpecError(f"model {model_config.name!r}: table_backend {backend!r} is not available")
    return build(get_model(model_config.model), scale=model_config.scale, seed=model_config.seed)


def share_model(model: RecModel) -> RecModel:
    """Move every parameter and buffer into shared memory (read-only use by all workers)."""
    return model.share_memory()


@dataclass
class WorkerArgs:
    worker_id: int
    stage: str
    cores: list[int]
    threads: int
    model_config: Any


def run_stage(model: RecModel, stage: str, payload: Any) -> Any:
    if stage == "dense":
        dense, pooled = payload
        return model.dense(torch.from_numpy(dense), [torch.from_numpy(p) for p in pooled]).numpy()
    dense, values, lengths = payload
    batch = QueryBatch(torch.from_numpy(dense), torch.from_numpy(values), torch.from_numpy(lengths))
    if stage == "model":
        return model(batch).numpy()
    return [t.numpy() for t in model.sparse(batch)]


def _pin(args: WorkerArgs) -> None:
    if args.cores:
        os.sched_setaffinity(0, args.cores)
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set by an earlier parallel op: harmless


def worker_main(conn: Any, args: WorkerArgs, shared_model: RecModel | None) -> None:
    """Entry point of a worker process: pin, build (or adopt the shared model), serve items."""
    _pin(args)
    model = shared_model if shared_model is not None else build_worker_model(args.model_config)
    model.eval()
    conn.send(("ready", os.getpid()))
    with torch.inference_mode():
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            if msg is None:
                return
            item_id, payload = msg
            start = time.perf_counter()
            try:
                result = run_stage(model, args.stage, payload)
                reply = (item_id, True, result, time.perf_counter() - start)
            except Exception as exc:  # a bad item must not kill the worker
                reply = (item_id, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
            try:
                conn.send(reply)
            except (BrokenPipeError, OSError):
                return
