"""Node configuration: which models one node server hosts and how each is executed.

A node config is YAML::

    host: 127.0.0.1
    http_port: 8000          # 0 = pick a free port
    grpc_port: 8001
    models:
      - model: dlrm-rmc1     # catalogue name (ModelSpec)
        name: rmc1           # served name (default: model)
        scale: 1.0e-3
        workers: 2           # model mode: whole-model workers; pipeline mode: dense workers
        cores: [[0], [1]]    # per-worker core sets, or a flat list shared out `threads` cores at a time
        threads: 1           # torch intra-op threads per worker
        sub_batch: 64        # split a query into parts of at most this many items (0 = never split)
        mode: model          # model | pipeline (sparse workers feed dense workers)
        sparse_workers: 1    # pipeline only
        sparse_cores: null   # pipeline only, like cores
        share_tables: true   # one copy of the weights in shared memory for all workers
        fuse_tables: true    # pool all tables in one lookup per embedding width (zoo/fused.py; DRAM tables,
                             # catalogue models): same scores, rmc1 at batch 1 0.99 -> 0.54 ms on a CPU worker
        max_batch_size: 1024
        queue_limit: 64      # queries admitted but not finished; more -> 503 / UNAVAILABLE
        deadline_ms: null    # a query's deadline when the client sets no `timeout` (null = twice the model's
                             # SLA target); queries that cannot finish by it are shed (503), late ones get 504
        fuse_items: 256      # fuse queued queries into one forward pass of at most this many items (0 = off)
        hang_timeout_s: 10.0 # a worker whose loop is silent this long is hung: its queries get 504, it is replaced
        forward_to_idle: true  # a busy worker sends a query to a less loaded worker (serving/worker/siblings.py):
                             # one gRPC channel's calls use every worker, not only the one that accepted it
        accelerator:         # optional: accelerator workers beside the CPU workers (serving/worker/accel.py)
          device: cuda       # cpu | cuda | cuda:N (cpu: DeepRecSys' offload of large queries to a many-threaded worker)
          workers: 1         # accelerator worker processes (they accept no client connections)
          threads: 4         # CPU threads of each accelerator worker
          min_items: 256     # queries with at least this many items go to an accelerator worker
          fuse_items: 4096   # largest fused launch in items
          fuse_delay_us: 0   # how long a worker waits for more queries before launching (Triton's max_queue_delay)
          staging_mb: 128    # shared memory per CPU worker -> accelerator worker link (pinned on a GPU; 0: socket)
          cores: [0, 1]      # optional: pin them (each takes `threads` of these in turn, or one list per
                             # worker), e.g. to split one host's cores between a GPU node and a CPU node
          device_table_mb: null  # optional: MiB of device memory for embedding rows; the tables stay in host
                             # memory and their most looked-up rows are cached on the device (zoo/device_cache.py);
                             # null = whole tables on the device.  Any device, cpu included; DRAM tables only
          pass_thread: false # true: passes on a thread, queries read and answered during one (no faster measured)
    repository: /srv/models  # optional: a model repository (serving/node/repository.py) loaded beside `models`
    strict_readiness: true   # not ready while a repository model failed to load and serves no version (Triton's)
    exit_on_error: false     # true: a model that fails to load at start stops the node (Triton's --exit-on-error)

Everything is validated here (pydantic models, ``recserve/schema.py``: unknown keys and wrong types refused) so
that a typo fails at load time with one line ``where: field: message``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, InstanceOf, StrictBool, field_validator, model_validator

from recserve.errors import SpecError
from recserve.schema import Schema, integer, number
from recserve.serving.transport.h2limits import FloodLimits, Rate
from recserve.serving.wire.codec import MAX_JSON_BYTES
from recserve.serving.worker.eventloop import EVENT_LOOPS
from recserve.specs import ModelSpec, get_model, read_yaml

MODES = ("model", "pipeline")
FRONT_ENDS = ("workers", "server")
DEADLINE_SLA_FACTOR = 2.0
DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def default_deadline_ms(sla_target_ms: float) -> float:
    """A query's deadline when neither the client nor the config sets one: room for the tail the SLA allows past
    its target, and no more."""
    return DEADLINE_SLA_FACTOR * float(sla_target_ms)


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def expand_cores(cores: Any, workers: int, threads: int, where: str) -> list[list[int]]:
    """Per-worker core sets from a config value (None, flat list, or list of lists)."""
    usable = set(available_cores())
    if cores is None:
        return [[] for _ in range(workers)]  # empty = inherit the server's affinity
    if not isinstance(cores, list | tuple) or not cores:
        raise SpecError(f"{where}: cores must be a non-empty list")
    if all(isinstance(c, int) for c in cores):
        flat = [int(c) for c in cores]
        step = max(1, threads)
        sets = [[flat[(i * step + k) % len(flat)] for k in range(min(step, len(flat)))] for i in range(workers)]
    elif all(isinstance(c, list | tuple) and c for c in cores):
        if len(cores) != workers:
            raise SpecError(f"{where}: cores lists {len(cores)} core sets for {workers} workers")
        sets = [[int(x) for x in c] for c in cores]
    else:
        raise SpecError(f"{where}: cores must be a list of core ids or a list of core-id lists")
    for s in sets:
        bad = sorted(set(s) - usable)
        if bad:
            raise SpecError(f"{where}: cores {bad} are not available on this host (usable: {sorted(usable)})")
    return sets


def check_device(device: Any, where: str) -> None:
    """``cpu``, ``cuda`` or ``cuda:N`` that this host can use; a CUDA device on a host without one is refused here,
    not in a worker that would die at start."""
    if not isinstance(device, str) or not DEVICE.fullmatch(device):
        raise SpecError(f"{where} must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        raise SpecError(f"{where} is {device!r} but CUDA is not available on this host "
                        f"(torch {torch.__version__}); use device: cpu or a host with a GPU")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise SpecError(f"{where} is {device!r} but this host has {torch.cuda.device_count()} CUDA device(s)")


def served_name(model: str) -> str:
    """The default served name: the model's, or for a repository model named by path (``REPO/ctr[/2]``) its
    directory's (``ctr``), since a name is one segment of the protocol's URLs."""
    if "/" not in model:
        return model
    parts = [p for p in model.split("/") if p]
    return parts[-2] if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


class AcceleratorConfig(Schema):
    """A model's accelerator workers (``serving/worker/accel.py``): where they compute and which queries they take."""

    device: str = "cuda"
    workers: integer(1, 10**9) = 1
    threads: integer(1, 10**9) = 1
    min_items: integer(1, 10**9) = 256
    fuse_items: integer(1, 10**9) = 4096
    fuse_delay_us: integer(0, 10**9) = 0
    staging_mb: integer(0, 10**9) = 128  # shared memory per CPU worker -> accelerator worker link (0: the socket)
    cores: Any = None  # pinned like a model's workers (``expand_cores``); None = the server's affinity
    device_table_mb: number(ge=0, le=2**40) | None = None  # device memory for cached rows (None: whole tables)
    pass_thread: StrictBool = False  # passes on a thread: the worker reads and answers during one (accel._compute)

    @field_validator("device")
    @classmethod
    def _device_name(cls, device: str) -> str:
        if not DEVICE.fullmatch(device):
            raise ValueError(f"must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        return device

    def check(self, where: str) -> None:
        """What needs this host: the device and the cores (after the model's own rules, which say more)."""
        where = f"{where} accelerator"
        check_device(self.device, f"{where}: device")
        self.core_sets(where)

    def core_sets(self, where: str = "accelerator") -> list[list[int]]:
        """One core set per accelerator worker (empty: inherit the server's affinity)."""
        return expand_cores(self.cores, self.workers, self.threads, f"{where} cores")


class ServingSettings(Schema):
    """How a model is executed: the fields a node config's model entry and a repository's config.yaml share."""

    workers: integer(1) = 1  # model mode: whole-model workers; pipeline mode: dense workers
    cores: Any = None  # checked by expand_cores, which knows the worker count and this host's cores
    threads: integer(1) = 1
    sub_batch: integer(0) = 0
    mode: Literal[MODES] = "model"
    sparse_workers: integer(1) = 1
    sparse_cores: Any = None
    share_tables: StrictBool = True
    fuse_tables: StrictBool = True
    max_batch_size: integer(1) = 1024
    queue_limit: integer(1) = 64
    llc_ways: integer(1) | None = None
    deadline_ms: number(gt=0, lt=1e7) | None = None  # None: default_deadline_ms of the model's SLA
    fuse_items: integer(0) = 256
    hang_timeout_s: number(gt=0, lt=1e7) = 10.0
    forward_to_idle: StrictBool = True  # a busy worker sends a query to a less loaded sibling (one channel uses all)
    accelerator: AcceleratorConfig | None = None  # None = CPU workers only


class ModelConfig(ServingSettings):
    """How one model is served on this node."""

    model: str
    name: str = ""
    scale: float = Field(1e-3, gt=0, le=1)  # lax: YAML 1.1 reads 1e-3 (no dot) as a string
    seed: integer() = 0
    table_backend: str = "dram"
    options: dict[str, Any] | None = Field(default_factory=dict)
    # Repository models (serving/node/repository.py): the artifact file of one version and the spec describing it.
    # A catalogue model has neither and is served as version 1 with random weights at ``scale``.
    artifact: str = ""
    version: integer() = 1
    spec: InstanceOf[ModelSpec] | None = None

    @classmethod
    def where_of(cls, data: dict[str, Any]) -> str:
        return f"model {data.get('name') or served_name(str(data.get('model', '')))!r}"

    @model_validator(mode="after")
    def _resolve(self) -> ModelConfig:
        """The rules across fields: the served name, a repository path's artifact, the spec (naming the known
        models if unknown), the deadline's default, the accelerator's needs, and the cores on this host."""
        self.name = self.name or served_name(self.model)
        where = f"model {self.name!r}"
        if self.spec is None and not self.artifact and "/" in self.model and Path(self.model).is_dir():
            self._from_repository_path()
        spec = self.model_spec()  # raises SpecError naming the known models
        if self.artifact:
            self._check_split(where)
        if self.deadline_ms is None:
            self.deadline_ms = default_deadline_ms(spec.sla.target_ms)
        self._check_accelerator(where)
        self.worker_cores()  # validate early
        if self.mode == "pipeline":
            self.sparse_worker_cores()
        return self

    def _check_accelerator(self, where: str) -> None:
        if self.accelerator is None:
            return
        if self.mode != "model":
            raise SpecError(f"{where}: accelerator needs mode: model (whole queries), got mode: {self.mode}")
        host_tables = self._host_tables()
        device = self.accelerator.device
        if host_tables and device.startswith("cuda"):
            raise SpecError(f"{where}: accelerator device {device!r} cannot serve {host_tables} (its tables are "
                            "read on the host); use device: cpu or DRAM tables")
        self.accelerator.check(where)
        if self.accelerator.device_table_mb is not None:  # the cache is built from tables held in memory
            from recserve.zoo.artifacts import PROGRAM_KINDS, artifact_kind

            program = bool(self.artifact) and artifact_kind(Path(self.artifact)) in PROGRAM_KINDS
            if host_tables or program:
                raise SpecError(f"{where}: accelerator device_table_mb caches rows of tables held in memory; "
                                f"this model has {host_tables or 'a program artifact ' + repr(self.artifact)}")

    def _from_repository_path(self) -> None:
        """``model: REPO/<model>[/<version>]`` serves that artifact (profiling serves repository models so)."""
        from recserve.serving.node.repository import reference_spec
        from recserve.zoo.artifacts import reference_artifact

        self.spec = reference_spec(self.model)
        artifact = reference_artifact(self.model)
        self.artifact, self.version = str(artifact), int(artifact.parent.name)

    def model_spec(self) -> ModelSpec:
        """The spec of what is served: the artifact's own for repository models, else the catalogue's."""
        return self.spec if self.spec is not None else get_model(self.model)

    def served_rows(self) -> tuple[int, ...]:
        """Table rows the served model holds: an artifact's real rows, a catalogue model's scaled ones."""
        spec = self.model_spec()
        return tuple(t.rows for t in spec.tables) if self.artifact else spec.scaled_rows(self.scale)

    def _host_tables(self) -> str:
        """What keeps this model's tables out of plain memory (tiering, an SSD or sharded backend), or ""."""
        if (self.options or {}).get("tier"):
            return "tiering"
        return f"table_backend: {self.table_backend}" if self.table_backend != "dram" else ""

    def _check_split(self, where: str) -> None:
        """A program artifact has no sparse/dense split: refuse the layouts that need one, saying why."""
        from recserve.zoo.artifacts import PROGRAM_KINDS, artifact_kind, no_split_reason, program_exposes_split

        if artifact_kind(Path(self.artifact)) not in PROGRAM_KINDS:
            return
        tables = self._host_tables()
        if not tables and self.mode != "pipeline":
            return
        splits = program_exposes_split(Path(self.artifact))
        needs = tables or ("" if splits else "mode: pipeline")
        if needs:
            raise SpecError(f"{where} version {self.version} ({self.artifact}): {needs} needs a sparse/dense split; "
                            f"{no_split_reason(self.artifact, splits)}")

    def worker_cores(self) -> list[list[int]]:
        return expand_cores(self.cores, self.workers, self.threads, f"model {self.name!r} cores")

    def sparse_worker_cores(self) -> list[list[int]]:
        return expand_cores(self.sparse_cores, self.sparse_workers, self.threads, f"model {self.name!r} sparse_cores")

    def oversubscribed(self) -> str:
        """Why this model's workers run more threads than they have cores ("" when they do not): each then waits
        for the others' threads, so a pass takes longer than with fewer threads."""
        usable = len(available_cores())
        for stage, (workers, core_sets) in self.stages().items():
            pinned = {c for cores in core_sets for c in cores}
            cores = len(pinned) or usable
            if workers * self.threads > cores:
                return (f"model {self.name!r}: {workers} {stage} worker(s) x {self.threads} threads run on {cores} "
                        f"core(s); set threads to at most {max(1, cores // workers)} (or give them more cores)")
        return ""

    def stages(self) -> dict[str, tuple[int, list[list[int]]]]:
        """Worker pools: stage name -> (workers, per-worker cores)."""
        if self.mode == "model":
            return {"model": (self.workers, self.worker_cores())}
        return {"sparse": (self.sparse_workers, self.sparse_worker_cores()),
                "dense": (self.workers, self.worker_cores())}


Burst = tuple[number(gt=0), number(gt=0)]
Window = integer(65_535, 2**31 - 1)


class GrpcLimits(Schema):
    """The node config's ``grpc_limits``: HTTP/2 frames that carry no request, per connection
    (serving/transport/h2limits.py); rates as ``[burst, per_s]``, an absent key keeps FloodLimits' default."""

    pings: Burst | None = None
    settings: Burst | None = None
    resets: Burst | None = None
    server_resets: Burst | None = None
    glitches: Burst | None = None
    empty_data: integer(0) | None = None
    continuations: integer(0) | None = None
    stream_window: Window | None = None
    connection_window: Window | None = None

    def flood_limits(self) -> FloodLimits:
        given = {k: getattr(self, k) for k in self.model_fields_set if getattr(self, k) is not None}
        return FloodLimits(**{k: Rate(*v) if isinstance(v, tuple) else v for k, v in given.items()})


class NodeConfig(Schema):
    models: list[ModelConfig] = Field(default_factory=list)
    host: str = "127.0.0.1"
    http_port: integer(0, 65535) = 0
    grpc_port: integer(0, 65535) = 0
    max_body_bytes: integer(1) = 64 * 1024 * 1024
    max_json_bytes: integer(1) = MAX_JSON_BYTES  # the JSON part of an infer request; tensors beyond go binary
    read_timeout_s: number(gt=0, lt=1e6) = 30.0  # a request must arrive whole within this, else 408 and close
    keep_alive_timeout_s: number(gt=0, lt=1e6) = 300.0  # a connection with no request in progress this long closes
    max_connections: integer(1) = 4096  # per worker and protocol; at it the connections waiting longest for a
    # request make room for a new one; with none such HTTP answers 503, gRPC GOAWAY, and close
    # HTTP/2 frames that carry no request, per connection: given as GrpcLimits, held as FloodLimits
    grpc_limits: GrpcLimits | None = None
    drain_timeout_s: number(ge=0) = 30.0
    server_name: str = "recserve"
    # "workers": whole-query models' workers accept and answer HTTP queries themselves (data plane v2);
    # "server": one front-end process decodes every query and ships it to the workers (the v1 layout).
    front_end: Literal[FRONT_ENDS] = "workers"
    # the workers' event loop: "auto" (uvloop where its probe passes, else asyncio), "uvloop", "asyncio"
    # (serving/worker/eventloop.py); a worker asked for uvloop where it cannot run uses asyncio and the node says why
    event_loop: Literal[EVENT_LOOPS] = "auto"
    # bearer token the control API requires; needed when host is not loopback (see serving/node/control_api.py)
    control_token: str | None = None
    # PEM files; with them HTTP and gRPC speak TLS and the node uses front_end: server (see serving/node/tls.py)
    tls_cert: str | None = None
    tls_key: str | None = None
    # A model repository (serving/node/repository.py) whose models are loaded at start, beside ``models``.
    repository: str | None = None
    # Triton's strict readiness: /v2/health/ready is false while a repository model failed to load and serves no
    # version (false: ready whatever failed, the failures only in the repository index)
    strict_readiness: StrictBool = True
    # Triton's --exit-on-error: a model that fails to load at start stops the node, which exits with the reasons
    # (false: it serves what loaded, not ready while strict_readiness holds)
    exit_on_error: StrictBool = False

    @classmethod
    def where_of(cls, data: dict[str, Any]) -> str:
        return "node config"

    @model_validator(mode="before")
    @classmethod
    def _models_by_name(cls, data: Any) -> Any:
        """``models`` may also map served names to entries: ``{rmc1: {scale: 1e-3}}``."""
        if isinstance(data, dict) and isinstance(data.get("models"), dict):
            data = {**data, "models": [{"name": k, "model": k, **(v or {})} if isinstance(v, dict | None) else v
                                       for k, v in data["models"].items()]}
        return data

    @field_validator("grpc_limits", mode="before")
    @classmethod
    def _limits_given(cls, value: Any) -> Any:
        """FloodLimits (set in code) as the mapping a config file gives."""
        if isinstance(value, FloodLimits):
            return {k: [v.burst, v.per_s] if isinstance(v, Rate) else v for k, v in vars(value).items()}
        return value

    @model_validator(mode="after")
    def _across_fields(self) -> NodeConfig:
        if not self.models and not self.repository:
            raise SpecError("node config: needs at least one model or a repository")
        if not isinstance(self.grpc_limits, FloodLimits):
            self.grpc_limits = (self.grpc_limits or GrpcLimits()).flood_limits()
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SpecError("node config: tls_cert and tls_key go together (PEM certificate chain and its key)")
        if self.tls_cert:
            self.front_end = "server"  # a TLS session cannot be handed between processes (serving/node/tls.py)
        offloading = [m.name for m in self.models if m.accelerator is not None]
        if offloading and self.front_end != "workers":
            raise SpecError(f"node config: models {offloading} have an accelerator, which needs front_end: workers "
                            "(the CPU workers dispatch large queries to it; TLS forces front_end: server)")
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SpecError(f"node config: served model names must be unique, repeated: {dupes}")
        return self

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


def flood_limits(given: Any) -> FloodLimits:
    """The node config's ``grpc_limits`` as ``FloodLimits``: rates as ``[burst, per_s]``, counts as integers."""
    if given is None or isinstance(given, FloodLimits):
        return given or FloodLimits()
    return GrpcLimits.parse(given, "node config: grpc_limits").flood_limits()


def config_from_dict(data: Any, where: str = "node config") -> NodeConfig:
    return NodeConfig.parse(data, where)


def load_config(path: str | Path) -> NodeConfig:
    """Read a node config YAML file (see the module docstring for the schema)."""
    return config_from_dict(read_yaml(path), str(path))


def quick_config(model: str, scale: float = 1e-3, workers: int = 1, http_port: int = 0, grpc_port: int = 0,
                 **model_options: Any) -> NodeConfig:
    """One model, the ``recserve serve --model NAME`` form."""
    return NodeConfig(models=[ModelConfig(model=model, scale=scale, workers=workers, **model_options)],
                      http_port=http_port, grpc_port=grpc_port)
