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

from dataclasses import dataclass
from functools import cache

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

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


GEMM_OPS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.")


@dataclass(frozen=True)
class CallCounts:
    """What one forward call dispatches, counted on the real module (framework overhead scales with it).

    ``*_ops`` are ATen operators dispatched (scripted loops included: DIEN's AUGRU is ~3,000 small ops),
    ``*_modules`` are ``nn.Module`` invocations (each costs a Python call and hook checks), and
    ``gemm_rows_per_item`` is the FLOP-weighted number of GEMM rows one item contributes: 1 for an MLP,
    the sequence length for DIN's attention, so GEMM efficiency is judged on the matrix that runs.
    """

    sparse_ops: int
    dense_ops: int
    sparse_modules: int
    dense_modules: int
    gemm_rows_per_item: float
    dense_written_bytes_per_item: float = 0.0  # outputs of the dense part's non-GEMM operators
    # operators the dense part launches on a GPU: an ``nn.RNNBase`` module decomposes into ~14 ATen operators per
    # time step on the CPU, but on a CUDA device ATen hands the whole recurrence to one cuDNN call (``use_cudnn``
    # -> ``gru_cudnn_stub`` in ``RNN.cpp``), which launches its kernels natively, about one per step; 0 = dense_ops
    device_dense_ops: int = 0


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.gemms: list[tuple[int, float]] = []  # (rows, flops)
        self.written = 0.0  # bytes output by non-GEMM operators (element-wise work over activations)
        self.rnn_depth = 0  # inside an nn.RNNBase module (set by ``_count``'s hooks)
        self.rnn_ops = 0  # operators dispatched there
        self.rnn_steps = 0  # time steps those modules ran

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's hook
        self.ops += 1
        self.rnn_ops += self.rnn_depth > 0
        name = str(func)
        if name.startswith(GEMM_OPS):
            a, b = (args[1], args[2]) if "addmm" in name or "baddbmm" in name else (args[0], args[1])
            rows = a.shape[0] if a.dim() == 2 else a.shape[0] * a.shape[1]
            self.gemms.append((rows, 2.0 * rows * a.shape[-1] * b.shape[-1]))
            return func(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and not t._is_view():
                self.written += t.numel() * t.element_size()
        return out


def _count(model: nn.Module, call) -> tuple[_OpCounter, int, object]:  # noqa: ANN001
    modules = 0
    counter = _OpCounter()

    def pre_hook(*_: object) -> None:
        nonlocal modules
        modules += 1

    def rnn_enter(module: nn.RNNBase, inputs: tuple) -> None:
        counter.rnn_depth += 1
        if counter.rnn_depth == 1 and inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dim() == 3:
            counter.rnn_steps += int(inputs[0].shape[1 if module.batch_first else 0])

    def rnn_leave(*_: object) -> None:
        counter.rnn_depth -= 1

    handles = [m.register_forward_pre_hook(pre_hook) for m in model.modules()]
    rnns = [m for m in model.modules() if isinstance(m, nn.RNNBase)]
    handles += [h for m in rnns for h in (m.register_forward_pre_hook(rnn_enter), m.register_forward_hook(rnn_leave))]
    try:
        with torch.no_grad(), counter:
            out = call()
    finally:
        for h in handles:
            h.remove()
    return counter, modules, out


@cache
def count_calls(spec: ModelSpec, batch: int = 4) -> CallCounts:
    """Operators, module calls and GEMM shapes of one ``batch``-item forward (tiny tables, CPU)."""
    from recserve.zoo import build, sample_batch

    model = build(spec, scale=1e-12, min_rows=4).eval()
    query = sample_batch(model, batch)
    with torch.no_grad():  # warm-up: TorchScript's profiling runs dispatch extra ops on the first calls
        for _ in range(2):
            model(query)
    sparse, sparse_modules, pooled = _count(model, lambda: model.sparse(query))
    dense, dense_modules, _ = _count(model, lambda: model.dense(query.dense, pooled))
    flops = sum(f for _, f in dense.gemms)
    rows = sum(r * f for r, f in dense.gemms) / flops / batch if flops else 1.0
    # bytes per item = the slope between two batch sizes (per-call work such as weight sums cancels)
    bigger = sample_batch(model, 3 * batch)
    with torch.no_grad():
        pooled_big = model.sparse(bigger)
    dense_big, _, _ = _count(model, lambda: model.dense(bigger.dense, pooled_big))
    written = max(0.0, (dense_big.written - dense.written) / (2 * batch))
    device_ops = max(1, dense.ops - dense.rnn_ops + dense.rnn_steps)
    return CallCounts(sparse.ops, dense.ops, sparse_modules, dense_modules, float(rows), written, device_ops)
