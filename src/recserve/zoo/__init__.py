"""Real PyTorch recommendation models built from a ModelSpec (see ``zoo.build``)."""

from __future__ import annotations

from pathlib import Path

import torch

from recserve.errors import SpecError
from recserve.specs import ModelSpec
from recserve.zoo.base import DramTable, RecModel, TableLookup
from recserve.zoo.batch import QueryBatch, random_batch
from recserve.zoo.din import DIEN, DIN
from recserve.zoo.dlrm import DLRM
from recserve.zoo.ncf import NCF
from recserve.zoo.wnd import MultiTaskWideAndDeep, WideAndDeep

FAMILY_CLASSES: dict[str, type[RecModel]] = {
    "dlrm": DLRM,
    "wnd": WideAndDeep,
    "mtwnd": MultiTaskWideAndDeep,
    "ncf": NCF,
    "din": DIN,
    "dien": DIEN,
}


def build(spec: ModelSpec, scale: float = 1e-3, seed: int = 0, min_rows: int = 16) -> RecModel:
    """Build ``spec`` with table rows shrunk by ``scale`` (everything else full size), in eval mode."""
    cls = FAMILY_CLASSES.get(spec.family)
    if cls is None:
        raise SpecError(f"model {spec.name!r}: family {spec.family!r} has no zoo implementation yet")
    torch.manual_seed(seed)
    model = cls(spec, spec.scaled_rows(scale, min_rows))
    return model.eval()


def build_or_load(spec: ModelSpec, scale: float = 1e-3, seed: int = 0) -> RecModel:
    """What a measurement runs: :func:`build`, or for a repository model named by its path (``REPO/<model>[/<v>]``,
    see ``specs.get_model``) its own artifact, trained weights and real rows (``scale`` does not apply)."""
    if "/" in spec.name and Path(spec.name).is_dir():
        from recserve.zoo.artifacts import load_artifact, reference_artifact

        return load_artifact(reference_artifact(spec.name), spec).eval()  # type: ignore[return-value]
    return build(spec, scale=scale, seed=seed)


def sample_batch(model: RecModel, batch_size: int, rng=0, sampler=None) -> QueryBatch:
    """A synthetic query that fits ``model`` (uniform ids unless a workload sampler is given)."""
    spec = model.spec
    kwargs = {"sampler": sampler} if sampler is not None else {}
    return random_batch(
        spec.dense_in,
        model.rows,
        tuple(t.pooling for t in spec.tables),
        batch_size,
        rng,
        fixed=tuple(t.kind == "sequence" for t in spec.tables),
        **kwargs,
    )


__all__ = ["DramTable", "QueryBatch", "RecModel", "TableLookup", "build", "build_or_load", "random_batch",
           "sample_batch"]
