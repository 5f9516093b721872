"""Dense FLOPs per candidate item, counted on the real module rather than re-derived by hand.

Dense layers do not depend on table rows, so the model is built with tiny tables and one item is
run through it with hooks on every Linear / GRU / GRUCell and on every zoo layer that reports its own
work through a ``dense_flops(inputs, output)`` method (DIN's factored activation unit, attention
pooling, DLRM's dot interaction).  The AUGRU computes through ``nn.Linear`` and is counted by those
hooks.  This keeps the count true to what the zoo executes for every family.  Element-wise
activations and gate arithmetic are not counted (as for ``nn.GRU``).
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


@cache
def dense_flops_per_item(spec: ModelSpec) -> int:
    from recserve.zoo import build, sample_batch

    model = build(spec, scale=1e-12, min_rows=4)
    total = 0

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], _out: object) -> None:
        nonlocal total
        if isinstance(module, nn.Linear):
            total += _linear_flops(module, inputs)
        elif isinstance(module, nn.GRU | nn.GRUCell):
            total += _gru_flops(module, inputs)
        else:
            total += int(module.dense_flops(inputs, _out))

    handles = [m.register_forward_hook(hook) for m in model.modules() if _counted(m)]
    try:
        with torch.no_grad():
            model(sample_batch(model, 1))
    finally:
        for h in handles:
            h.remove()
    return total
