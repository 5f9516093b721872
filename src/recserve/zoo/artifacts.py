"""Models a user brings, as files: the server loads them without importing the user's code.

Three artifact kinds, one per file name in a version directory (``REPO/<model>/<version>/``):

- ``model.safetensors`` + a spec YAML (``spec.yaml`` in the version or the model directory): a zoo architecture
  of the user's own (tables with rows/dim/pooling, MLP widths, interaction) with trained weights.  Tables are
  memory-mapped from the file, never copied: every worker maps the same page-cache pages, so N workers cost
  one copy of the tables (and a table larger than RAM pages in on demand or is tiered to SSD by SDM).
- ``model.pt2``: a ``torch.export`` program; ``model.pt``: a TorchScript module.  Either takes
  ``(dense, sparse_values, sparse_lengths)`` (the wire tensors, ``zoo/batch.py``) and returns ``scores``.
  Their input layout (tables, rows, dims) comes from the ``recserve_spec.json`` extra file that
  :func:`export_program` writes, else from a spec YAML beside it, else (``.pt2`` of any architecture) is read off
  the program itself (:func:`derived_spec`: shapes, embedding weights, FLOPs counted by running it).  A program
  is one opaque computation, so the sparse/dense split (pipelines, ElasticRec shards, SDM tiers) is refused for
  it with a clear message.

Every load is checked by running one small batch (:func:`check_artifact`): a broken artifact is refused with
:class:`ArtifactError` naming the file and the reason, before any worker starts.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from recserve.errors import RecserveError, SpecError
from recserve.specs import ModelSpec, model_from_dict, read_yaml, to_dict, version_dirs, version_number
from recserve.zoo.base import RecModel
from recserve.zoo.batch import QueryBatch, random_batch

ARTIFACT_KINDS = {"model.safetensors": "safetensors", "model.pt2": "export", "model.pt": "torchscript"}
PROGRAM_KINDS = ("export", "torchscript")
SPEC_FILE = "spec.yaml"
SPEC_EXTRA = "recserve_spec.json"  # the spec a program carries inside its archive
CHECK_BATCH = 2


class ArtifactError(RecserveError):
    """A model file cannot be served: the message names the file and why."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


# ---------------------------------------------------------------- finding and describing artifacts


def find_artifact(version_dir: Path) -> Path:
    """The one artifact file of a version directory."""
    found = [version_dir / name for name in ARTIFACT_KINDS if (version_dir / name).exists()]
    if not found:
        raise ArtifactError(version_dir, f"no model file (expected one of {', '.join(ARTIFACT_KINDS)})")
    if len(found) > 1:
        raise ArtifactError(version_dir, f"several model files ({', '.join(p.name for p in found)}); keep one")
    return found[0]


def reference_artifact(reference: str) -> Path:
    """The artifact a repository path names: ``REPO/<model>/<version>``, or the newest version of ``REPO/<model>``."""
    path = Path(reference.rstrip("/"))
    if version_number(path.name) is None:
        versions = version_dirs(path)
        if not versions:
            raise ArtifactError(path, "no version directory (e.g. 1/)")
        path = path / str(versions[-1])
    return find_artifact(path)


def artifact_kind(path: Path) -> str:
    kind = ARTIFACT_KINDS.get(Path(path).name)
    if kind is None:
        raise ArtifactError(path, f"not a model file name (expected one of {', '.join(ARTIFACT_KINDS)})")
    return kind


def read_spec(path: Path, name: str, defaults: dict[str, Any] | None = None) -> ModelSpec:
    """A user's spec YAML: one model mapping (catalogue syntax), ``defaults`` (e.g. the SLA) filled in."""
    try:
        data = read_yaml(path)
        if isinstance(data, dict) and isinstance(data.get("models"), dict) and len(data["models"]) == 1:
            data = next(iter(data["models"].values()))
        if not isinstance(data, dict):
            raise SpecError("expected a mapping describing one model")
        return model_from_dict(name, {**(defaults or {}), **data, "name": name})
    except SpecError as exc:
        raise ArtifactError(path, f"bad spec: {exc}") from exc


def spec_file_for(artifact: Path) -> Path | None:
    """``spec.yaml`` beside the artifact, else in the model directory above it."""
    for candidate in (artifact.parent / SPEC_FILE, artifact.parent.parent / SPEC_FILE):
        if candidate.exists():
            return candidate
    return None


def artifact_spec(artifact: Path, name: str, defaults: dict[str, Any] | None = None) -> ModelSpec:
    """The ModelSpec that describes an artifact's inputs (and, for planning, its size)."""
    artifact = Path(artifact)
    kind = artifact_kind(artifact)
    if not artifact.exists():
        raise ArtifactError(artifact, "no such file")
    if kind in PROGRAM_KINDS:
        embedded = _embedded_spec(artifact, kind)
        if embedded is not None:
            try:
                return model_from_dict(name, {**(defaults or {}), **embedded, "name": name})
            except SpecError as exc:
                raise ArtifactError(artifact, f"bad {SPEC_EXTRA} inside the program: {exc}") from exc
    spec_path = spec_file_for(artifact)
    if spec_path is None and kind == "export":
        return derived_spec(artifact, name, defaults)
    if spec_path is None:
        what = f"a {SPEC_EXTRA} inside the program or " if kind in PROGRAM_KINDS else ""
        raise ArtifactError(artifact, f"no spec: needs {what}a {SPEC_FILE} in {artifact.parent} or "
                                      f"{artifact.parent.parent} (tables with rows/dim/pooling, dense_in, MLPs)")
    return read_spec(spec_path, name, defaults)


def derived_spec(artifact: Path, name: str, defaults: dict[str, Any] | None = None) -> ModelSpec:
    """What a torch.export program of any architecture says about itself: ``dense_in``, the number of tables and
    ``towers`` from its input/output shapes, each table's rows and dim from the weights its embedding lookups read
    (in graph order, one per table), dense FLOPs per item counted by running it.  Pooling factors are not in a
    program: taken as 1 (a spec.yaml beside it gives them)."""
    try:
        program = _load_export(artifact)
    except Exception as exc:  # noqa: BLE001
        raise ArtifactError(artifact, f"cannot read the program: {type(exc).__name__}: {_first_line(exc)}") from exc
    signature = program.graph_signature
    if len(signature.user_inputs) != 3:
        raise ArtifactError(artifact, f"the program takes {len(signature.user_inputs)} inputs; expected 3 "
                                      "(dense, sparse_values, sparse_lengths)")
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    dense, _, lengths = (nodes[n].meta["val"].shape for n in signature.user_inputs)
    outputs = program.graph.output_node().args[0]
    dense_in, tables = _static(artifact, "dense dim 1", dense[1]), _static(artifact, "sparse_lengths dim 0", lengths[0])
    towers = _static(artifact, "scores dim 1", outputs[0].meta["val"].shape[1])
    state = {**program.state_dict, **program.constants}
    keys = {**signature.inputs_to_parameters, **signature.inputs_to_buffers,
            **signature.inputs_to_lifted_tensor_constants}
    weights: dict[str, torch.Tensor] = {}
    for node in program.graph.nodes:
        if node.op == "call_function" and "embedding" in str(node.target) and node.args:
            arg = node.args[0]
            if getattr(arg, "name", None) in keys:
                weights.setdefault(arg.name, state[keys[arg.name]])
    if len(weights) != tables:
        raise ArtifactError(artifact, f"the program looks up {len(weights)} embedding weight(s) for {tables} tables in "
                                      f"sparse_lengths, so each table's rows cannot be read off it; put a {SPEC_FILE} "
                                      "beside it")
    table_ids = {id(w) for w in weights.values()}
    dense_params = sum(t.numel() for t in program.state_dict.values() if id(t) not in table_ids)
    table_specs = [{"name": f"table{t}", "rows": int(w.shape[0]), "dim": int(w.shape[1])}
                   for t, w in enumerate(weights.values())]
    data = {"family": "program", "interaction": "program", "dense_in": dense_in, "towers": towers,
            "tables": table_specs, "dense_params": int(dense_params), "source": f"derived from {artifact.name}"}
    spec = model_from_dict(name, {"sla": {"target_ms": 100.0}, **(defaults or {}), **data})
    return dataclasses.replace(spec, dense_flops=_flops_per_item(program.module(), spec))


def _static(artifact: Path, what: str, size: Any) -> int:
    if not isinstance(size, int):
        raise ArtifactError(artifact, f"{what} is dynamic ({size}) in the program; it must be fixed")
    return size


def batch_bound(model: nn.Module) -> int | None:
    """The largest batch a loaded (``load_artifact``) ``torch.export`` program was exported to take: the range of
    its ``dense`` input's dim 0 (``Dim("batch", max=...)``), which its unlifted module keeps.  None for an unbounded
    batch, another kind of model, or a torch that keeps the range elsewhere."""
    program = model.__dict__.get("program")  # a ProgramModel's: TorchScript's is no fx graph
    graph = program.graph if isinstance(program, torch.fx.GraphModule) else None
    placeholders = [n for n in graph.nodes if n.op == "placeholder"] if graph is not None else []
    size = placeholders[0].meta.get("val").shape[0] if placeholders and "val" in placeholders[0].meta else None
    if size is None or isinstance(size, int):
        return size
    try:
        upper = size.node.shape_env.var_to_range[size.node.expr].upper
    except (AttributeError, KeyError):
        return None
    return int(upper) if getattr(upper, "is_finite", True) and upper < 1 << 62 else None


def _flops_per_item(program: Any, spec: ModelSpec) -> float:
    """Dense FLOPs per item: the FLOP counter's total at batch 3 minus at batch 1, halved (per-call work cancels)."""
    from torch.utils.flop_counter import FlopCounterMode

    totals = []
    for size in (1, 3):
        batch = random_batch(spec.dense_in, tuple(t.rows for t in spec.tables), tuple(1 for _ in spec.tables), size)
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            program(batch.dense, batch.values, batch.lengths)
        totals.append(counter.get_total_flops())
    return max(0.0, (totals[1] - totals[0]) / 2)


def _embedded_spec(artifact: Path, kind: str) -> dict[str, Any] | None:
    extra = {SPEC_EXTRA: ""}
    try:
        if kind == "torchscript":
            torch.jit.load(str(artifact), map_location="cpu", _extra_files=extra)
        else:
            _load_export(artifact, extra)
    except Exception as exc:  # noqa: BLE001 - any reader failure means the file is broken
        raise ArtifactError(artifact, f"cannot read the program: {type(exc).__name__}: {_first_line(exc)}") from exc
    text = extra[SPEC_EXTRA]
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ArtifactError(artifact, f"{SPEC_EXTRA} inside the program is not JSON: {exc}") from exc
    data.pop("name", None)
    return data


def _load_export(artifact: Path, extra: dict[str, str] | None = None) -> Any:
    torch_log = logging.getLogger("torch.export")
    torch_log.addFilter(_unreadable_archive)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pt2 archive warnings about weight grouping
            return torch.export.load(str(artifact), extra_files=extra)
    finally:
        torch_log.removeFilter(_unreadable_archive)


def _unreadable_archive(record: logging.LogRecord) -> bool:
    """Drop torch's logged traceback for a file that is no archive: the load's error says it in one line."""
    return not str(record.msg).startswith("Ran into the following error when deserializing")


def _first_line(exc: BaseException) -> str:
    """The line of an exception's message that says what went wrong (TorchScript puts it last, after a trace)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if "TorchScript interpreter" in lines[0]:
        return lines[-1][:300]
    return lines[0][:300]


# ---------------------------------------------------------------- loading


class ProgramModel(nn.Module):
    """A torch.export program or TorchScript module behind the zoo interface (``forward(batch)``)."""

    def __init__(self, spec: ModelSpec, program: Any, path: Path) -> None:
        super().__init__()
        self.spec = spec
        self.rows = tuple(t.rows for t in spec.tables)
        self.sequence_lengths = {i: t.pooling for i, t in enumerate(spec.tables) if t.kind == "sequence"}
        self.path = path
        # held outside nn.Module's registry: an exported program refuses .train()/.eval() (it is already eval)
        self.__dict__["program"] = program

    def forward(self, batch: QueryBatch) -> torch.Tensor:
        return self.program(batch.dense, batch.values, batch.lengths)

    def sparse(self, batch: QueryBatch) -> list[torch.Tensor]:
        """The program's own ``sparse`` method's output (one tensor, whatever its layout), if it has one."""
        if not exposes_split(self.program):
            raise ArtifactError(self.path, no_split_reason(self.path))
        return [self.program.sparse(batch.dense, batch.values, batch.lengths)]

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        if not exposes_split(self.program):
            raise ArtifactError(self.path, no_split_reason(self.path))
        return self.program.dense(dense, pooled[0])


def exposes_split(program: Any) -> bool:
    """A TorchScript module with ``sparse(dense, values, lengths) -> T`` and ``dense(dense, T) -> scores`` methods
    (what :func:`export_program` writes) can run as a sparse/dense pipeline."""
    return isinstance(program, torch.jit.ScriptModule) and all(
        hasattr(program, m) for m in ("sparse", "dense"))


def program_exposes_split(artifact: Path) -> bool:
    return artifact_kind(artifact) == "torchscript" and exposes_split(torch.jit.load(str(artifact), map_location="cpu"))

    def validate(self, batch: QueryBatch, max_batch: int | None = None) -> None:
        batch.validate(self.spec.dense_in, self.rows, self.sequence_lengths, max_batch)


def no_split_reason(path: Path | str, pipeline_ok: bool = False) -> str:
    """Why a program cannot be split: tiers and shards replace a zoo model's tables, which a program holds inside;
    a pipeline needs ``sparse`` and ``dense`` methods, which only a TorchScript module can carry."""
    kind = "a torch.export program" if str(path).endswith(".pt2") else "a TorchScript module"
    if pipeline_ok:
        return (f"{kind} holds its tables inside, so they cannot be placed on ElasticRec shards or SDM tiers; "
                "export the model as spec.yaml + model.safetensors for that")
    return (f"{kind} is one opaque computation with no sparse/dense split, so it cannot run as a pipeline, "
            "on ElasticRec shards or with SDM-tiered tables; serve it with mode: model, export it as TorchScript with "
            "sparse() and dense() methods (export_program does) for a pipeline, or as spec.yaml + model.safetensors")


def load_artifact(artifact: Path, spec: ModelSpec) -> nn.Module:
    """A runnable model (``forward(batch) -> scores``) from an artifact file, described by ``spec``."""
    artifact = Path(artifact)
    kind = artifact_kind(artifact)
    if not artifact.exists():
        raise ArtifactError(artifact, "no such file")
    if kind == "safetensors":
        return load_safetensors(artifact, spec)
    try:
        if kind == "torchscript":
            program = torch.jit.load(str(artifact), map_location="cpu")
        else:
            program = _load_export(artifact).module()
    except Exception as exc:  # noqa: BLE001
        raise ArtifactError(artifact, f"cannot read the program: {type(exc).__name__}: {_first_line(exc)}") from exc
    return ProgramModel(spec, program, artifact)


def load_safetensors(path: Path, spec: ModelSpec) -> RecModel:
    """The zoo model of ``spec`` with its weights from ``path``; tables memory-mapped (shared page cache)."""
    from safetensors import SafetensorError, safe_open

    from recserve.zoo import FAMILY_CLASSES

    cls = FAMILY_CLASSES.get(spec.family)
    if cls is None:
        raise ArtifactError(path, f"spec family {spec.family!r} has no zoo implementation")
    model = cls(spec, tuple(1 for _ in spec.tables)).eval()  # tiny tables: the real ones are mapped below
    expected = model.state_dict()
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            table_keys = {f"tables.{t}.bag.weight": t for t in range(len(spec.tables))}
            missing = sorted(set(expected) - keys)
            unexpected = sorted(keys - set(expected))
            if missing or unexpected:
                raise ArtifactError(path, f"tensors do not match the spec: missing {missing[:5]}, "
                                          f"unexpected {unexpected[:5]}")
            dense_state = {}
            for key in sorted(keys):
                tensor = f.get_tensor(key)
                want = ((spec.tables[table_keys[key]].rows, spec.tables[table_keys[key]].dim)
                        if key in table_keys else tuple(expected[key].shape))
                if tuple(tensor.shape) != want or tensor.dtype != expected[key].dtype:
                    raise ArtifactError(path, f"tensor {key!r} is {tensor.dtype} {list(tensor.shape)}, the spec "
                                              f"needs {expected[key].dtype} {list(want)}")
                if key in table_keys:
                    _map_table(model, table_keys[key], tensor)
                else:
                    dense_state[key] = tensor
    except SafetensorError as exc:
        raise ArtifactError(path, f"not a readable safetensors file: {exc}") from exc
    except OSError as exc:
        raise ArtifactError(path, f"cannot read: {exc}") from exc
    model.load_state_dict(dense_state, strict=False)
    model.rows = tuple(t.rows for t in spec.tables)
    return model


def _map_table(model: RecModel, t: int, weight: torch.Tensor) -> None:
    """Back table ``t`` by a memory-mapped tensor (no copy; EmbeddingBag only reads it)."""
    table = model.tables[t]
    table.bag.weight = nn.Parameter(weight, requires_grad=False)
    table.bag.num_embeddings = table.num_rows = int(weight.shape[0])


def check_artifact(artifact: Path, spec: ModelSpec) -> nn.Module:
    """Load and run one small batch: a broken artifact fails here, with the file and the reason."""
    model = load_artifact(artifact, spec)
    batch = random_batch(spec.dense_in, tuple(t.rows for t in spec.tables), tuple(t.pooling for t in spec.tables),
                         CHECK_BATCH, 0, fixed=tuple(t.kind == "sequence" for t in spec.tables))
    try:
        with torch.inference_mode():
            scores = model(batch)
    except Exception as exc:  # noqa: BLE001 - whatever the program raises, the artifact is refused
        raise ArtifactError(artifact, f"running a batch of {CHECK_BATCH} raised {type(exc).__name__}: "
                                      f"{_first_line(exc)}") from exc
    want = (CHECK_BATCH, spec.towers)
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != want:
        got = list(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ArtifactError(artifact, f"a batch of {CHECK_BATCH} returned scores {got}, expected {list(want)}")
    if scores.dtype != torch.float32 or not bool(torch.isfinite(scores).all()):
        raise ArtifactError(artifact, f"scores must be finite FP32, got {scores.dtype} {scores.tolist()}")
    return model


# ---------------------------------------------------------------- writing (users, the example, tests)


def save_safetensors(model: RecModel, path: Path | str) -> Path:
    """Write ``model``'s weights in the layout :func:`load_safetensors` reads (its ``state_dict`` names)."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path))
    return Path(path)


def save_spec(spec: ModelSpec, path: Path | str) -> Path:
    """A spec YAML a user could have written (what :func:`read_spec` reads)."""
    import yaml

    data = to_dict(spec)
    data.pop("name", None)
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
    return Path(path)


class WireModule(nn.Module):
    """A pooled-table zoo model as one program over the wire tensors, free of data-dependent shapes.

    All tables are concatenated into one weight (padded to the widest dim) and looked up with a single
    ``embedding_bag`` over per-(table, sample) bags: ``torch.export`` and ``torch.jit.trace`` both capture it
    with a dynamic batch.  The dense part is the model's own ``dense`` (tables removed from the copy)."""

    def __init__(self, model: RecModel) -> None:
        super().__init__()
        if model.sequence_lengths:
            raise SpecError(f"model {model.spec.name!r}: export supports pooled tables only (sequence tables "
                            "need a gather of data-dependent length)")
        dims = [t.dim for t in model.spec.tables]
        width = max(dims)
        weights = [F.pad(t.weight.detach(), (0, width - t.dim)) for t in model.tables]
        self.register_buffer("weight", torch.cat(weights))
        self.register_buffer("row_base", torch.tensor([0, *model.rows[:-1]], dtype=torch.int64).cumsum(0))
        self.dims = dims
        self.dense_part = copy.deepcopy(model)
        self.dense_part.tables = nn.ModuleList()

    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.dense(dense, self.sparse(dense, values, lengths))

    def sparse(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Pooled embeddings ``[tables, batch, widest dim]`` (the split a TorchScript export exposes)."""
        tables, batch = lengths.shape
        lens = lengths.to(torch.int64)
        offsets = torch.cat([lens.new_zeros(1), torch.cumsum(lens.reshape(-1), 0)])
        table_of = torch.repeat_interleave(torch.arange(tables, device=lens.device), lens.sum(1),
                                           output_size=values.shape[0])
        return F.embedding_bag(values + self.row_base[table_of], self.weight, offsets, mode="sum",
                               include_last_offset=True).view(tables, batch, -1)

    def dense(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.dense_part.dense(dense, [pooled[t, :, :d] for t, d in enumerate(self.dims)])


def export_program(model: RecModel, path: Path | str) -> Path:
    """Write ``model`` as ``model.pt2`` (torch.export) or ``model.pt`` (TorchScript), its spec inside."""
    path = Path(path)
    kind = artifact_kind(path)
    if kind not in PROGRAM_KINDS:
        raise ArtifactError(path, "export_program writes model.pt2 or model.pt")
    wire = WireModule(model).eval()
    example = random_batch(model.spec.dense_in, model.rows, tuple(t.pooling for t in model.spec.tables), 4, 0)
    args = (example.dense, example.values, example.lengths)
    extra = {SPEC_EXTRA: json.dumps(to_dict(model.spec))}
    with torch.no_grad():
        if kind == "torchscript":
            pooled = wire.sparse(*args)
            traced = torch.jit.trace_module(wire, {"forward": args, "sparse": args, "dense": (args[0], pooled)})
            torch.jit.save(traced, str(path), _extra_files=extra)
        else:
            batch_dim, ids = torch.export.Dim("batch", min=1, max=1 << 20), torch.export.Dim("ids", min=1)
            program = torch.export.export(wire, args, dynamic_shapes=({0: batch_dim}, {0: ids}, {1: batch_dim}))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pt2 archive notes about weight grouping
                torch.export.save(program, str(path), extra_files=extra)
    return path


def write_version(model: RecModel, model_dir: Path | str, version: int, kind: str = "safetensors") -> Path:
    """Write ``model`` as ``model_dir/<version>/`` of a repository (``kind``: safetensors, export or torchscript)."""
    names = {k: n for n, k in ARTIFACT_KINDS.items()}
    if kind not in names:
        raise SpecError(f"artifact kind must be one of {sorted(names)}, got {kind!r}")
    version_dir = Path(model_dir) / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / names[kind]
    if kind == "safetensors":
        save_spec(model.spec, version_dir / SPEC_FILE)
        return save_safetensors(model, path)
    return export_program(model, path)
