"""Dense FLOPs per candidate item, counted on the real module rather than re-derived by hand.

Dense layers do not depend on table rows or values, so the model is built with tiny tables (on the
``meta`` device when its MLPs are huge) and one item's sparse outputs run through ``model.dense``
with hooks on every
Linear / GRU / GRUCell and on every zoo layer that reports its own work through a
``dense_flops(inputs, output)`` method (DIN's factored activation unit, attention pooling and dot
scores, the AUGRU recurrence, DLRM's dot interaction).  This keeps the count true to what the zoo
executes for every family.  Element-wise activations and gate arithmetic are not counted (as for
``nn.GRU``).
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn

from recserve.specs import ModelSpec


def _linear_flops(module: nn.Linear, inputs: tuple[torch.Tensor, ...]) -> int:
    x = inputs[0]
    return 2 * (x.numel() // x.shape[-1]) * module.in_features * module.out_features


def _gru_flops(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    x = inputs[0]
    steps = x.numel() // x.shape[-1]
    h = module.hidden_size
    return 2 * steps * 3 * (module.input_size * h + h * h)


def _counted(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear | nn.GRU | nn.GRUCell) or callable(getattr(module, "dense_flops", None))


def count_dense_flops(model: nn.Module, dense: torch.Tensor, pooled: list[torch.Tensor]) -> int:
    """FLOPs of one ``model.dense(dense, pooled)`` call, summed over the hooked layers."""
    total = 0

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: object) -> None:
        nonlocal total
        if isinstance(module, nn.Linear):
            total += _linear_flops(module, inputs)
        elif isinstance(module, nn.GRU | nn.GRUCell):
            total += _gru_flops(module, inputs)
        else:
            total += int(module.dense_flops(inputs, out))

    handles = [m.register_forward_hook(hook) for m in model.modules() if _counted(m)]
    try:
        with torch.no_grad():
            model.dense(dense, pooled)
    finally:
        for h in handles:
            h.remove()
    return total


def sparse_outputs(spec: ModelSpec, batch: int = 1, device: str | torch.device = "meta") -> list[torch.Tensor]:
    """Placeholders shaped like ``model.sparse`` output: pooled ``[B, dim]``, sequences ``[B, L, dim]``."""
    return [
        torch.zeros((batch, t.pooling, t.dim) if t.kind == "sequence" else (batch, t.dim), device=device)
        for t in spec.tables
    ]


# Above this many dense weights the count runs on the meta device instead of allocating them.
META_ABOVE_WEIGHTS = 20_000_000


def count_spec_flops(spec: ModelSpec, device: str = "cpu") -> int:
    """Dense FLOPs for one item of ``spec``, running ``model.dense`` on ``device`` ("cpu" or "meta")."""
    from recserve.zoo import build

    with torch.device(device):
        model = build(spec, scale=1e-12, min_rows=4)
    dense = torch.zeros(1, spec.dense_in, device=device)
    return count_dense_flops(model, dense, sparse_outputs(spec, device=device))


@cache
def dense_flops_per_item(spec: ModelSpec) -> int:
    """Dense FLOPs for one candidate item.  Models with huge MLPs (SDM's M2, M3: up to 4.3 G weights)
    are counted on the meta device (shapes only: no memory, no arithmetic, but the first meta run
    imports torch._dynamo, ~2 s CPU); the rest on CPU with tiny tables."""
    with torch.device("meta"):
        from recserve.zoo import build

        weights = sum(p.numel() for n, p in build(spec, scale=1e-12, min_rows=4).named_parameters()
                      if not n.startswith("tables."))
    return count_spec_flops(spec, "meta" if weights > META_ABOVE_WEIGHTS else "cpu")
