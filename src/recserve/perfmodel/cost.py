"""What one candidate item costs a model: dense FLOPs, weight bytes, operators, embedding traffic.

FLOPs and weights are counted on the real zoo module when the zoo can build the family (so the
count matches what is served); otherwise they are estimated from the spec's layer widths.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from recserve.errors import SpecError
from recserve.specs import ModelSpec

if TYPE_CHECKING:
    from recserve.zoo.flops import CallCounts


@dataclass(frozen=True)
class ModelCost:
    flops_per_item: float
    weight_bytes: float
    dense_ops: int  # ATen operators one dense call dispatches
    tables: int
    lookups_per_item: float
    gather_bytes_per_item: float
    emb_bytes: float
    pooled_bytes_per_item: float  # SparseNet output handed to DenseNet (pipeline hop, PCIe)
    index_bytes_per_item: float
    dense_in_bytes_per_item: float
    table_rows: tuple[int, ...]
    table_row_bytes: tuple[int, ...]
    table_lookups: tuple[int, ...]
    source: str  # "zoo" or "analytic"
    activation_bytes_per_item: float = 0.0  # written by dense layers per item (GRU/attention over sequences)
    multihot_bytes_per_item: float = 0.0  # gathered by pooled tables with pooling > 1 (what NMP reduces in memory)
    multihot_pooled_bytes_per_item: float = 0.0  # their pooled results
    sparse_ops: int = 0  # ATen operators one sparse call dispatches
    sparse_modules: int = 0  # nn.Module invocations of one sparse call
    dense_modules: int = 0  # ... of one dense call
    gemm_rows_per_item: float = 1.0  # FLOP-weighted GEMM rows per item (sequence length for attention)
    device_dense_ops: int = 0  # operators one dense call launches on a GPU (0: as dense_ops); see CallCounts
    # bytes per item of each tensor one forward call allocates (operator outputs that are not views or in-place, sizes
    # growing with the batch): the ones past MMAP_MAX_BYTES at a call's size are mapped fresh every call
    alloc_bytes_per_item: tuple[float, ...] = ()
    # kernels one call launches on a GPU (operators writing a tensor of their own; views launch none; an RNN module
    # one per step): see _forward_profile.  0 = not counted (then the dispatched operators stand in)
    device_sparse_launches: int = 0
    device_dense_launches: int = 0


# glibc's cap on its dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit): a larger allocation is always mmapped
# and unmapped when freed, so its pages fault in (and are zeroed) on every call; smaller ones are reused from the heap
MMAP_MAX_BYTES = 32 * 2**20


def _mlp(widths: tuple[int, ...], n_in: int) -> tuple[float, float, int, int]:
    """(flops, params, layers, out width) of a Linear stack."""
    flops = params = 0.0
    for w in widths:
        flops += 2.0 * n_in * w
        params += n_in * w + w
        n_in = w
    return flops, params, len(widths), n_in


def analytic_dense(spec: ModelSpec) -> tuple[float, float, int]:
    """(FLOPs per item, weight params, dense layers) from widths alone, for families the zoo lacks."""
    flops = params = 0.0
    layers = 0
    f, p, n, out = _mlp(spec.bottom_mlp, spec.dense_in)
    flops, params, layers = flops + f, params + p, layers + n
    pooled = [t for t in spec.tables if t.kind == "pooled"]
    if spec.interaction == "dot":
        k = len(spec.tables) + 1
        flops += 2.0 * k * k * out
        top_in = out + k * (k - 1) // 2
    else:
        top_in = out + sum(t.dim for t in pooled)
    for t in spec.sequence_tables:
        length, d = t.pooling, t.dim
        if spec.interaction == "gru":
            h = spec.gru_hidden
            flops += 2.0 * length * 3 * (d * h + h * h)
            params += 3 * (d * h + h * h + 2 * h)
            layers += 1
            d_att = h
        else:
            d_att = d
        f, p, n, _ = _mlp(tuple(spec.attention_mlp) + (1,), 4 * d_att)
        flops += length * f
        params, layers = params + p, layers + n
        top_in += d_att
    f, p, n, out = _mlp(spec.top_mlp, top_in)
    flops, params, layers = flops + f, params + p, layers + n
    if spec.towers > 1 or spec.tower_mlp:
        f, p, n, _ = _mlp(tuple(spec.tower_mlp) + (1,), out)
        flops, params, layers = flops + spec.towers * f, params + spec.towers * p, layers + spec.towers * n
    return flops, params, layers


def analytic_calls(spec: ModelSpec) -> CallCounts:
    """Operator and module counts from the layout, for families the zoo cannot build (what the zoo
    dispatches per table and per layer: indices/offsets slicing + the bag; Linear + activation)."""
    from recserve.zoo.flops import CallCounts

    flops, _, layers = analytic_dense(spec)
    seq_steps = sum(t.pooling for t in spec.sequence_tables) if spec.interaction == "gru" else 0
    seq_flops = sum(t.pooling * 2.0 * 4 * t.dim * (spec.attention_mlp[0] if spec.attention_mlp else 1)
                    for t in spec.sequence_tables)
    rows = 1.0 + sum(t.pooling - 1 for t in spec.sequence_tables[:1]) * min(seq_flops / max(flops, 1.0), 1.0)
    return CallCounts(sparse_ops=3 * len(spec.tables) + 5, dense_ops=4 * layers + 16 * seq_steps + 5,
                      sparse_modules=len(spec.tables) + 1, dense_modules=2 * layers + 2, gemm_rows_per_item=rows)


def analytic_launches(spec: ModelSpec) -> tuple[int, int]:
    """GPU kernels of one call (sparse, dense) from the layout, for families the zoo cannot build: a bag per table and
    the ids' offsets (cast, zeros, cumsum); a GEMM and an activation per layer, a cuDNN launch and DIEN's AUGRU step
    (~11 kernels, as the zoo's scripted loop runs) per recurrent step, and the head's concat and sigmoid."""
    _, _, layers = analytic_dense(spec)
    steps = sum(t.pooling for t in spec.sequence_tables) if spec.interaction == "gru" else 0
    return len(spec.tables) + 3, 2 * layers + 12 * steps + 2


def analytic_activation_bytes(spec: ModelSpec) -> float:
    """Layer outputs per item from widths (sequence layers once per step), for families the zoo lacks."""
    widths = sum(spec.bottom_mlp) + sum(spec.top_mlp) + spec.towers * (sum(spec.tower_mlp) + 1)
    for t in spec.sequence_tables:
        per_step = sum(spec.attention_mlp) + 1 + (3 * spec.gru_hidden if spec.interaction == "gru" else 0)
        widths += t.pooling * (per_step + 4 * t.dim)
    return 4.0 * widths


def _zoo_dense(spec: ModelSpec) -> tuple[float, float, CallCounts, float, tuple[float, ...], tuple[int, int]] | None:
    """(FLOPs, dense params, call counts, activation bytes, allocation sizes, GPU kernel launches (sparse, dense))
    per item counted on the zoo module, or None."""
    try:
        from recserve.zoo import build
        from recserve.zoo.flops import count_calls, dense_flops_per_item

        model = build(spec, scale=1e-12, min_rows=4)
        flops = float(dense_flops_per_item(spec))
        calls = count_calls(spec)
    except (SpecError, NotImplementedError, ImportError, KeyError):
        return None
    table_params = {id(p) for t in model.tables for p in t.parameters()}
    params = sum(p.numel() for p in model.parameters() if id(p) not in table_params)
    sizes, launches = _forward_profile(model.eval())
    return flops, float(params), calls, calls.dense_written_bytes_per_item, sizes, launches


ZOO_COUNT_MAX_BYTES = 256e6  # larger dense parts are estimated, not instantiated


def _forward_profile(model, batch: int = 4) -> tuple[tuple[float, ...], tuple[int, int]]:  # noqa: ANN001 - zoo module
    """One dispatch-counted forward (sparse part, then dense part, as ``forward`` runs them) at ``batch`` and
    ``3·batch`` items: bytes per item of every tensor it allocates (the slope between the two sizes of each
    operator's outputs, skipping outputs that share an input's storage; sizes under 1 KB per item dropped), and the
    kernels one call launches on a GPU (sparse, dense) at ``batch`` items.

    A kernel is launched per operator that writes a tensor of its own; an operator whose every output shares an
    input's storage (``view``, ``select``, ``chunk``, ``unsqueeze``, ``t``, slicing) only makes a tensor header on
    the host and launches nothing.  Inside an ``nn.RNNBase`` module the CPU decomposition is not what the device
    runs: ATen hands the recurrence to one cuDNN call (``use_cudnn``), about one native launch per time step, so
    its operators count as its steps (as ``CallCounts.device_dense_ops`` does).  DIEN's scripted AUGRU loop is
    ATen operators on the device too, ~11 kernels and ~6 views per step: counted as it runs."""
    import torch

    from recserve.zoo import sample_batch

    runs, launches = [], (0, 0)
    hooks = _RnnSteps(model)  # they count into the current profile (the warm-up call's is dropped)
    try:
        with torch.no_grad():
            for b in (batch, 3 * batch):
                query = sample_batch(model, b)
                model(query)
                sizes, split = _profiled_call(model, query, hooks)
                runs.append(sizes)
                if b == batch:
                    launches = split
    finally:
        hooks.remove()
    if len(runs[0]) != len(runs[1]):
        return (), launches
    per_item = ((big - small) / (2 * batch) for small, big in zip(*runs, strict=True))
    return tuple(s for s in per_item if s >= 1024.0), launches


def _profiled_call(model, query, hooks: _RnnSteps) -> tuple[list[float], tuple[int, int]]:  # noqa: ANN001 - zoo
    """One call, sparse part then dense part, under a fresh dispatch profile: the storage bytes of each tensor it
    allocates, and the kernels it launches (sparse, dense)."""
    mode = hooks.mode = _dispatch_profile()()
    with mode:
        pooled = model.sparse(query)
        sparse_launches = mode.launches
        model.dense(query.dense, pooled)
    return mode.sizes, (sparse_launches, mode.launches - sparse_launches)


@cache
def _dispatch_profile() -> type:
    """A torch dispatch mode that records the storage bytes of every tensor an operator allocates and counts the
    operators that write a tensor of their own (kernel launches), none inside an RNN module (``rnn_depth``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Profile(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[float] = []
            self.launches = 0
            self.rnn_depth = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's hook
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in (*args, *(kwargs or {}).values())
                      if isinstance(a, torch.Tensor)}
            owned = False
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                    self.sizes.append(float(t.untyped_storage().nbytes()))
                    owned = True
            self.launches += owned and not self.rnn_depth
            return out

    return Profile


class _RnnSteps:
    """Hooks on a model's ``nn.RNNBase`` modules: a call of one counts its time steps as launches of the current
    profile (``mode``), and the operators inside it none."""

    def __init__(self, model) -> None:  # noqa: ANN001 - zoo module
        from torch import nn

        self.mode = _dispatch_profile()()
        rnns = [m for m in model.modules() if isinstance(m, nn.RNNBase)]
        self._handles = [h for m in rnns for h in (m.register_forward_pre_hook(self.enter),
                                                   m.register_forward_hook(self.leave))]

    def enter(self, module, inputs: tuple) -> None:  # noqa: ANN001 - nn.RNNBase
        import torch

        self.mode.rnn_depth += 1
        if self.mode.rnn_depth == 1 and inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dim() == 3:
            self.mode.launches += int(inputs[0].shape[1 if module.batch_first else 0])

    def leave(self, *_: object) -> None:
        self.mode.rnn_depth -= 1

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@cache
def model_cost(spec: ModelSpec) -> ModelCost:
    flops, params, _ = analytic_dense(spec)
    estimate = (flops, params, analytic_calls(spec), analytic_activation_bytes(spec), (), analytic_launches(spec))
    zoo = _zoo_dense(spec) if params * 4 <= ZOO_COUNT_MAX_BYTES else None
    flops, params, calls, act, allocs, launches = zoo if zoo is not None else estimate
    if spec.dense_flops:  # counted on the user's program (a repository model of no zoo family)
        flops, params = spec.dense_flops, float(spec.dense_params or params)
    bpe = spec.bytes_per_elem
    pooled_out = sum(t.dim * bpe * (t.pooling if t.kind == "sequence" else 1) for t in spec.tables)
    return ModelCost(
        flops_per_item=flops,
        weight_bytes=params * 4.0,
        dense_ops=max(1, calls.dense_ops),
        tables=len(spec.tables),
        lookups_per_item=float(spec.lookups_per_item),
        gather_bytes_per_item=float(spec.gather_bytes_per_item),
        emb_bytes=float(spec.embedding_bytes),
        pooled_bytes_per_item=float(pooled_out),
        index_bytes_per_item=8.0 * spec.lookups_per_item,
        dense_in_bytes_per_item=4.0 * spec.dense_in,
        table_rows=tuple(t.rows for t in spec.tables),
        table_row_bytes=tuple(t.row_bytes(bpe) for t in spec.tables),
        table_lookups=tuple(t.pooling for t in spec.tables),
        source="zoo" if zoo is not None else "analytic",
        activation_bytes_per_item=float(act),
        multihot_bytes_per_item=float(sum(t.pooling * t.row_bytes(bpe) for t in spec.tables
                                          if t.kind == "pooled" and t.pooling > 1)),
        multihot_pooled_bytes_per_item=float(sum(t.row_bytes(bpe) for t in spec.tables
                                                 if t.kind == "pooled" and t.pooling > 1)),
        sparse_ops=calls.sparse_ops,
        sparse_modules=calls.sparse_modules,
        dense_modules=calls.dense_modules,
        gemm_rows_per_item=calls.gemm_rows_per_item,
        device_dense_ops=calls.device_dense_ops or max(1, calls.dense_ops),
        alloc_bytes_per_item=allocs,
        device_sparse_launches=launches[0],
        device_dense_launches=launches[1],
    )


def scaled_spec(spec: ModelSpec, scale: float, min_rows: int = 16) -> ModelSpec:
    """``spec`` with the table rows the live zoo allocates at ``scale`` (what a host measurement ran)."""
    rows = spec.scaled_rows(scale, min_rows)
    tables = tuple(dataclasses.replace(t, rows=r) for t, r in zip(spec.tables, rows, strict=True))
    return dataclasses.replace(spec, tables=tables)


def zipf_hit(cached_rows: np.ndarray | float, rows: np.ndarray | float, s: float) -> np.ndarray:
    """Fraction of Zipf(s) accesses over ``rows`` ids that fall on the ``cached_rows`` hottest ids."""
    k = np.clip(np.asarray(cached_rows, dtype=float), 0.0, None)
    n = np.maximum(np.asarray(rows, dtype=float), 1.0)
    k = np.minimum(k, n)
    if s <= 1e-6:
        return k / n
    if abs(s - 1.0) < 1e-6:
        return np.log1p(k) / np.log1p(n)
    a = 1.0 - s
    return np.clip(((k + 1.0) ** a - 1.0) / ((n + 1.0) ** a - 1.0), 0.0, 1.0)
