"""A model repository in Triton's layout, so users' habits carry over::

    REPO/<model>/config.yaml            how to serve it (below) and which versions
    REPO/<model>/spec.yaml              optional: the architecture (for model.safetensors), shared by versions
    REPO/<model>/<version>/model.safetensors | model.pt2 | model.pt   (+ optional spec.yaml)

``config.yaml`` holds what a node config holds per model, plus the version policy (Triton's syntax)::

    workers: 2            cores: [0, 1]        threads: 1       sub_batch: 0      mode: model
    queue_limit: 64       max_query_size: 1024 sla: {target_ms: 20, percentile: 95}
    deadline_ms: 40       fuse_items: 256      hang_timeout_s: 5    forward_to_idle: true
    tiering: {dir: /ssd/tables, tables: user, cache_mb: 64}     # SDM (safetensors artifacts only)
    version_policy: {latest: {num_versions: 1}}   # or {all: {}} or {specific: {versions: [1, 3]}}

``recserve profile host``, ``plan search|shard|tier`` and the perfmodel take a repository model wherever they take
a catalogue name: ``--model REPO/<model>`` (newest version) or ``REPO/<model>/<version>`` (:func:`reference_spec`,
reached through ``specs.get_model``).

This module only reads the repository and turns a (model, version) into a validated
:class:`~recserve.serving.node.config.ModelConfig`; loading, swapping and unloading live in the node (server.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, model_validator

from recserve.errors import SpecError
from recserve.schema import Schema, integer
from recserve.serving.node.config import ModelConfig, ServingSettings
from recserve.specs import SLA, ModelSpec, _build, add_model_source, read_yaml, version_dirs, version_number

CONFIG_FILE = "config.yaml"
DEFAULT_SLA = {"target_ms": 100.0}  # when neither config.yaml nor the spec gives one
SERVING_FIELDS = frozenset(ServingSettings.model_fields)


@dataclass(frozen=True)
class VersionPolicy:
    """Triton's version policy: the newest ``latest`` versions, ``specific`` ones, or ``all``."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        available = sorted(available)
        if self.kind == "all":
            return available
        if self.kind == "specific":
            return [v for v in available if v in self.versions]
        return available[-self.num_versions:]

    def as_triton(self) -> dict[str, Any]:
        """The policy as Triton's model configuration writes it."""
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"latest": {"num_versions": self.num_versions}}


class LatestVersions(Schema):
    num_versions: integer(1) = 1


class AllVersions(Schema):
    pass


class SpecificVersions(Schema):
    versions: list[integer()] = Field(min_length=1)


class PolicyFile(Schema):
    """``version_policy``: exactly one of ``{latest: {num_versions: N}}``, ``{all: {}}``, ``{specific: {versions:
    [..]}}`` (an empty body may be null)."""

    latest: LatestVersions | None = None
    all: AllVersions | None = None
    specific: SpecificVersions | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        return {k: {} if v is None else v for k, v in data.items()} if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _exactly_one(self) -> PolicyFile:
        if len(self.model_fields_set) != 1:
            raise ValueError("must be one of {latest: {num_versions: N}}, {all: {}}, {specific: {versions: [..]}}")
        return self

    def policy(self) -> VersionPolicy:
        if self.specific is not None:
            return VersionPolicy("specific", versions=tuple(self.specific.versions))
        if self.latest is not None:
            return VersionPolicy("latest", self.latest.num_versions)
        return VersionPolicy("all")


def parse_policy(data: Any, where: str) -> VersionPolicy:
    """A config.yaml's ``version_policy`` (None: the newest version)."""
    found = ModelFile.parse({"version_policy": data}, where).version_policy
    return found.policy() if found is not None else VersionPolicy()


class ModelFile(ServingSettings):
    """A repository model's config.yaml: a node config's serving fields (Triton's ``max_query_size`` spelling too),
    its SLA, SDM tiering and version policy."""

    max_batch_size: integer(1) = Field(1024, validation_alias=AliasChoices("max_batch_size", "max_query_size"))
    name: str | None = None
    sla: dict[str, Any] | None = None  # config.yaml's SLA wins over the spec's
    tiering: dict[str, Any] | None = None  # the node config's tier: section (safetensors artifacts only)
    version_policy: PolicyFile | None = None


@dataclass(frozen=True)
class ModelSettings:
    """One repository model's config.yaml, parsed."""

    name: str
    serving: dict[str, Any]  # the ModelConfig fields config.yaml sets
    sla: dict[str, Any] | None
    tiering: dict[str, Any] | None
    policy: VersionPolicy


class Repository:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise SpecError(f"model repository {self.root}: no such directory")

    def relative(self, message: str) -> str:
        """``message`` with this repository's paths written from its root (``ctr/2/model.pt``): they name the file
        exactly and do not expose the host's directories (absolute paths are redacted from error bodies)."""
        root = str(self.root.resolve())
        return message.replace(root + "/", "").replace(str(self.root) + "/", "")

    def names(self) -> list[str]:
        """Models in the repository: every directory holding a config.yaml or a numeric version directory."""
        return sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith(".")
                      and ((d / CONFIG_FILE).exists() or version_dirs(d)))

    def holds(self, name: str) -> bool:
        """Whether ``name`` is a model directory of this repository (a plain name: no path into or out of it)."""
        return "/" not in name and not name.startswith(".") and (self.root / name).is_dir()

    def model_dir(self, name: str) -> Path:
        if not self.holds(name):
            raise SpecError(f"model repository {self.root}: no model {name!r}; found: {self.names()}")
        return self.root / name

    def versions(self, name: str) -> list[int]:
        """Version directories on disk, oldest first."""
        return version_dirs(self.model_dir(name))

    def settings(self, name: str) -> ModelSettings:
        path = self.model_dir(name) / CONFIG_FILE
        data = (read_yaml(path) if path.exists() else None) or {}
        found = ModelFile.parse(data, str(path))
        if found.name not in (None, name):
            raise SpecError(f"{path}: name {found.name!r} differs from the directory name {name!r}")
        serving = {k: getattr(found, k) for k in found.model_fields_set & SERVING_FIELDS}
        policy = found.version_policy.policy() if found.version_policy is not None else VersionPolicy()
        return ModelSettings(name, serving, found.sla, found.tiering, policy)

    def stamp(self, name: str, version: int) -> tuple[tuple[str, int, int], ...]:
        """What tells a load that a loaded version's files changed (Triton reloads such a version): each file of
        its directory and the model's config.yaml, with its size and modification time."""
        model_dir = self.model_dir(name)
        files = [model_dir / CONFIG_FILE, *sorted((model_dir / str(version)).rglob("*"))]
        found = []
        for path in files:
            try:
                st = path.stat()
            except OSError:  # gone meanwhile, or never there (no config.yaml)
                continue
            if not path.is_dir():
                found.append((str(path), st.st_size, st.st_mtime_ns))
        return tuple(found)

    def selected_versions(self, name: str) -> list[int]:
        available = self.versions(name)
        if not available:
            raise SpecError(f"model repository {self.root}: model {name!r} has no version directory (e.g. {name}/1/)")
        chosen = self.settings(name).policy.select(available)
        if not chosen:
            raise SpecError(f"model {name!r}: version_policy selects none of the versions on disk {available}")
        return chosen

    def spec(self, name: str, version: int | None = None) -> tuple[ModelSpec, Path]:
        """(spec, artifact) of a version (default: the newest on disk), with config.yaml's SLA."""
        from recserve.zoo.artifacts import artifact_spec, find_artifact

        settings = self.settings(name)
        on_disk = self.versions(name)
        version = version if version is not None else (on_disk[-1] if on_disk else 1)
        version_dir = self.model_dir(name) / str(version)
        if not version_dir.is_dir():
            raise SpecError(f"model {name!r}: no version {version} in {self.model_dir(name)} "
                            f"(versions on disk: {on_disk})")
        artifact = find_artifact(version_dir)
        spec = artifact_spec(artifact, name, {"sla": DEFAULT_SLA})
        if settings.sla is not None:
            spec = dataclasses.replace(spec, sla=_build(SLA, settings.sla, f"{self.model_dir(name) / CONFIG_FILE} sla"))
        return spec, artifact

    def model_config(self, name: str, version: int) -> ModelConfig:
        """The served-model config of one version: the artifact, its spec and the model's serving settings.

        Reads the spec (cheap); :func:`recserve.zoo.artifacts.check_artifact` runs the artifact (the node does
        that off its event loop before starting workers)."""
        settings = self.settings(name)
        spec, artifact = self.spec(name, version)
        options = {"tier": settings.tiering} if settings.tiering else {}
        return ModelConfig(model=name, name=name, scale=1.0, artifact=str(artifact), version=version, spec=spec,
                           options=options, **settings.serving)


def is_reference(name: str) -> bool:
    """Whether a model name is a path to a repository model (``REPO/<model>[/<version>]``)."""
    return "/" in name and Path(name).is_dir()


def repository_model(name: str) -> ModelSpec | None:
    """``specs.get_model``'s source for repository paths (REPO/<model>[/<version>]); None for anything else."""
    return reference_spec(name) if "/" in name and Path(name).is_dir() else None


add_model_source(repository_model)


def reference_spec(reference: str) -> ModelSpec:
    """The spec of a repository model named by path; its ``name`` is the path, so any process resolves it again."""
    path = Path(reference.rstrip("/"))
    version = version_number(path.name)
    model_dir = path.parent if version is not None else path
    spec, _ = Repository(model_dir.parent).spec(model_dir.name, version)
    return dataclasses.replace(spec, name=reference)
