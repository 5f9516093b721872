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

Everything is validated here so that a typo fails at load time with one clear message.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recserve.errors import SpecError
from recserve.serving.transport.h2limits import FloodLimits, Rate
from recserve.serving.wire.codec import MAX_JSON_BYTES
from recserve.serving.worker.eventloop import EVENT_LOOPS
from recserve.specs import ModelSpec, get_model, read_yaml

MODES = ("model", "pipeline")
DEADLINE_SLA_FACTOR = 2.0


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


@dataclass
class AcceleratorConfig:
    """A model's accelerator workers (``serving/worker/accel.py``): where they compute and which queries they take."""

    device: str = "cuda"
    workers: int = 1
    threads: int = 1
    min_items: int = 256
    fuse_items: int = 4096
    fuse_delay_us: int = 0
    staging_mb: int = 128  # shared memory per CPU worker -> accelerator worker link (0: queries cross the socket)
    cores: Any = None  # pinned like a model's workers (``expand_cores``); None = the server's affinity
    device_table_mb: float | None = None  # device memory for cached embedding rows (None: whole tables there)
    pass_thread: bool = False  # passes on a thread: the worker reads and answers during one (see accel._compute)

    def check(self, where: str) -> None:
        where = f"{where} accelerator"
        for key, low in (("workers", 1), ("threads", 1), ("min_items", 1), ("fuse_items", 1), ("fuse_delay_us", 0),
                         ("staging_mb", 0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 10**9:
                raise SpecError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
        check_device(self.device, f"{where}: device")
        if not isinstance(self.pass_thread, bool):
            raise SpecError(f"{where}: pass_thread must be true or false, got {self.pass_thread!r}")
        budget = self.device_table_mb
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float)
                                   or not 0 <= budget <= 2**40):
            raise SpecError(f"{where}: device_table_mb must be a number of MiB >= 0 (or null: whole tables on the "
                            f"device), got {budget!r}")
        self.core_sets(where)  # validate early

    def core_sets(self, where: str = "accelerator") -> list[list[int]]:
        """One core set per accelerator worker (empty: inherit the server's affinity)."""
        return expand_cores(self.cores, self.workers, self.threads, f"{where} cores")


def check_device(device: Any, where: str) -> None:
    """``cpu``, ``cuda`` or ``cuda:N`` that this host can use; a CUDA device on a host without one is refused here,
    not in a worker that would die at start."""
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
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


@dataclass
class ModelConfig:
    """How one model is served on this node."""

    model: str
    name: str = ""
    scale: float = 1e-3
    workers: int = 1
    cores: Any = None
    threads: int = 1
    sub_batch: int = 0
    mode: str = "model"
    sparse_workers: int = 1
    sparse_cores: Any = None
    share_tables: bool = True
    fuse_tables: bool = True
    max_batch_size: int = 1024
    queue_limit: int = 64
    seed: int = 0
    llc_ways: int | None = None
    table_backend: str = "dram"
    options: dict[str, Any] = field(default_factory=dict)
    deadline_ms: float | None = None
    fuse_items: int = 256
    hang_timeout_s: float = 10.0
    forward_to_idle: bool = True  # a busy worker sends a query to a less loaded sibling (one gRPC channel uses all)
    # Repository models (serving/node/repository.py): the artifact file of one version and the spec describing it.
    # A catalogue model has neither and is served as version 1 with random weights at ``scale``.
    artifact: str = ""
    version: int = 1
    spec: ModelSpec | None = None
    accelerator: Any = None  # an AcceleratorConfig (or its mapping, from YAML); None = CPU workers only

    def __post_init__(self) -> None:
        self.name = self.name or served_name(self.model)
        where = f"model {self.name!r}"
        if self.spec is None and not self.artifact and "/" in self.model and Path(self.model).is_dir():
            self._from_repository_path()
        spec = self.model_spec()  # raises SpecError naming the known models
        if self.artifact:
            self._check_split(where)
        if self.deadline_ms is None:
            self.deadline_ms = default_deadline_ms(spec.sla.target_ms)
        for key, low in (("deadline_ms", 0.0), ("hang_timeout_s", 0.0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not low < value < 1e7:
                raise SpecError(f"{where}: {key} must be a number > {low:g}, got {value!r}")
        for key in ("share_tables", "fuse_tables", "forward_to_idle"):
            if not isinstance(getattr(self, key), bool):
                raise SpecError(f"{where}: {key} must be true or false, got {getattr(self, key)!r}")
        if isinstance(self.fuse_items, bool) or not isinstance(self.fuse_items, int) or self.fuse_items < 0:
            raise SpecError(f"{where}: fuse_items must be an integer >= 0, got {self.fuse_items!r}")
        if self.mode not in MODES:
            raise SpecError(f"{where}: mode must be one of {MODES}, got {self.mode!r}")
        for key in ("workers", "threads", "max_batch_size", "queue_limit", "sparse_workers"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{where}: {key} must be an integer >= 1, got {value!r}")
        if not isinstance(self.sub_batch, int) or self.sub_batch < 0:
            raise SpecError(f"{where}: sub_batch must be an integer >= 0, got {self.sub_batch!r}")
        if not 0 < float(self.scale) <= 1:
            raise SpecError(f"{where}: scale must be in (0, 1], got {self.scale}")
        self.scale = float(self.scale)
        self._check_accelerator(where)
        self.worker_cores()  # validate early
        if self.mode == "pipeline":
            self.sparse_worker_cores()

    def _check_accelerator(self, where: str) -> None:
        if self.accelerator is None:
            return
        if isinstance(self.accelerator, dict):
            self.accelerator = _build(AcceleratorConfig, self.accelerator, f"{where} accelerator")
        if not isinstance(self.accelerator, AcceleratorConfig):
            raise SpecError(f"{where}: accelerator must be a mapping, got {type(self.accelerator).__name__}")
        if self.mode != "model":
            raise SpecError(f"{where}: accelerator needs mode: model (whole queries), got mode: {self.mode}")
        host_tables = self._host_tables()
        device = self.accelerator.device
        if host_tables and isinstance(device, str) and device.startswith("cuda"):
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

    def stages(self) -> dict[str, tuple[int, list[list[int]]]]:
        """Worker pools: stage name -> (workers, per-worker cores)."""
        if self.mode == "model":
            return {"model": (self.workers, self.worker_cores())}
        return {"sparse": (self.sparse_workers, self.sparse_worker_cores()),
                "dense": (self.workers, self.worker_cores())}


FRONT_ENDS = ("workers", "server")


@dataclass
class NodeConfig:
    models: list[ModelConfig]
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    max_body_bytes: int = 64 * 1024 * 1024
    max_json_bytes: int = MAX_JSON_BYTES  # the JSON part of an infer request; tensors beyond go binary
    read_timeout_s: float = 30.0  # a request must arrive whole within this, else 408 and close (slow clients)
    keep_alive_timeout_s: float = 300.0  # a connection with no request in progress this long is closed
    max_connections: int = 4096  # per worker and protocol; past it HTTP answers 503, gRPC GOAWAY, and close
    # HTTP/2 frames that carry no request, per connection (serving/transport/h2limits.py): None = its defaults;
    # {pings: [burst, per_s], settings: [...], resets: [...], server_resets: [...], empty_data: N, continuations: N}
    grpc_limits: Any = None
    drain_timeout_s: float = 30.0
    server_name: str = "recserve"
    # "workers": whole-query models' workers accept and answer HTTP queries themselves (data plane v2);
    # "server": one front-end process decodes every query and ships it to the workers (the v1 layout).
    front_end: str = "workers"
    # the workers' event loop: "auto" (uvloop where its probe passes, else asyncio), "uvloop", "asyncio"
    # (serving/worker/eventloop.py); a worker asked for uvloop where it cannot run uses asyncio and the node says why
    event_loop: str = "auto"
    # bearer token the control API requires; needed when host is not loopback (see serving/node/control_api.py)
    control_token: str | None = None
    # PEM files; with them HTTP and gRPC speak TLS and the node uses front_end: server (see serving/node/tls.py)
    tls_cert: str | None = None
    tls_key: str | None = None
    # A model repository (serving/node/repository.py) whose models are loaded at start, beside ``models``.
    repository: str | None = None

    def __post_init__(self) -> None:
        if not self.models and not self.repository:
            raise SpecError("node config: needs at least one model or a repository")
        for key in ("max_body_bytes", "max_json_bytes", "max_connections"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"node config: {key} must be an integer number of bytes >= 1, got {value!r}")
        for key in ("read_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
                raise SpecError(f"node config: {key} must be a number of seconds > 0, got {value!r}")
        if self.front_end not in FRONT_ENDS:
            raise SpecError(f"node config: front_end must be one of {FRONT_ENDS}, got {self.front_end!r}")
        if self.event_loop not in EVENT_LOOPS:
            raise SpecError(f"node config: event_loop must be one of {EVENT_LOOPS}, got {self.event_loop!r}")
        self.grpc_limits = flood_limits(self.grpc_limits)
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

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(data).__name__}")
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise SpecError(f"{where}: {exc}") from exc


def flood_limits(given: Any) -> FloodLimits:
    """The node config's ``grpc_limits`` as ``FloodLimits``: rates as ``[burst, per_s]``, counts as integers."""
    if given is None or isinstance(given, FloodLimits):
        return given or FloodLimits()
    where = "node config: grpc_limits"
    if not isinstance(given, dict):
        raise SpecError(f"{where} must be a mapping, got {given!r}")
    fields = {f.name: f for f in dataclasses.fields(FloodLimits)}
    values: dict[str, Any] = {}
    for key, value in given.items():
        if key not in fields:
            raise SpecError(f"{where}.{key}: unknown; expected one of {sorted(fields)}")
        if isinstance(getattr(FloodLimits(), key), Rate):
            if not (isinstance(value, list | tuple) and len(value) == 2
                    and all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in value)):
                raise SpecError(f"{where}.{key}: must be [burst, per_s], two numbers > 0, got {value!r}")
            values[key] = Rate(float(value[0]), float(value[1]))
        elif key.endswith("_window"):
            if isinstance(value, bool) or not isinstance(value, int) or not 65_535 <= value <= 2**31 - 1:
                raise SpecError(f"{where}.{key}: must be an integer of bytes in [65535, 2^31-1], got {value!r}")
            values[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"{where}.{key}: must be an integer >= 0, got {value!r}")
            values[key] = value
    return FloodLimits(**values)


def config_from_dict(data: Any, where: str = "node config") -> NodeConfig:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping")
    data = dict(data)
    raw_models = data.pop("models", None)
    if raw_models is None and data.get("repository"):
        raw_models = []
    elif isinstance(raw_models, dict):  # allow {served_name: {...}}
        raw_models = [{"name": k, **({"model": k} | (v or {}))} for k, v in raw_models.items()]
    if not isinstance(raw_models, list) or (not raw_models and not data.get("repository")):
        raise SpecError(f"{where}: 'models' must be a non-empty list")
    models = [_build(ModelConfig, m, f"{where} models[{i}]") for i, m in enumerate(raw_models)]
    return _build(NodeConfig, {**data, "models": models}, where)


def load_config(path: str | Path) -> NodeConfig:
    """Read a node config YAML file (see the module docstring for the schema)."""
    return config_from_dict(read_yaml(path), str(path))


def quick_config(model: str, scale: float = 1e-3, workers: int = 1, http_port: int = 0, grpc_port: int = 0,
                 **model_options: Any) -> NodeConfig:
    """One model, the ``recserve serve --model NAME`` form."""
    return NodeConfig(models=[ModelConfig(model=model, scale=scale, workers=workers, **model_options)],
                      http_port=http_port, grpc_port=grpc_port)
