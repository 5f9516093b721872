"""Layers the zoo families share: score heads, DIN's activation unit, attention pooling, AUGRU.

Every layer here either computes through ``nn.Linear`` / ``nn.GRU`` (which ``zoo.flops`` hooks) or
reports the FLOPs it does itself through a ``dense_flops(inputs, output)`` method, so the FLOP count
follows the code that actually runs.
"""

from __future__ import annotations

import warnings
from functools import cache

import torch
from torch import nn

from recserve.errors import SpecError
from recserve.specs import ModelSpec, TableSpec
from recserve.zoo.base import MLP, mlp

# DIN's activation unit (Zhou et al., KDD'18, Fig. 2) when a spec names no attention_mlp.
DEFAULT_ATTENTION_MLP = (80, 40)


class ScoreHead(MLP):
    """An MLP ending in ``out`` logits, however the paper wrote its last layer.

    - widths end in ``out`` (e.g. ``256-64-1``): used as written, no activation on the last layer;
    - widths end in 2 and one score is wanted (DIN/DIEN's ``200-80-2`` softmax head): the logit is
      ``z1 - z0``, so ``sigmoid(logit)`` equals the paper's ``softmax(z)[1]`` exactly;
    - otherwise (``1024-512-256``): every listed layer gets a ReLU and a ``Linear(last, out)`` follows.

    Being an ``MLP`` (an ``nn.Sequential``) keeps parameter names (``0.weight`` …) identical to a plain MLP.
    """

    def __init__(self, widths: tuple[int, ...], in_features: int, out: int) -> None:
        widths = tuple(int(w) for w in widths)
        self.two_class = bool(widths) and widths[-1] == 2 and out == 1
        if widths and (widths[-1] == out or self.two_class):
            layers = list(mlp(widths, in_features, last_activation=False))
        else:
            layers = list(mlp(widths, in_features, last_activation=True))
            layers.append(nn.Linear(widths[-1] if widths else in_features, out))
        super().__init__(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = super().forward(x)
        return z[:, 1:] - z[:, :1] if self.two_class else z


def mlp_out(widths: tuple[int, ...], in_features: int) -> int:
    return int(widths[-1]) if widths else in_features


def sum_sequences(embeddings: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sequence outputs ``[B, L, d]`` summed over L, for families that do not attend over them."""
    return [e.sum(dim=1) if e.dim() == 3 else e for e in embeddings]


def candidate_tables(spec: ModelSpec) -> dict[int, int]:
    """For each sequence table, the pooled item-side table whose embedding is the candidate item.

    Among pooled ``side: item`` tables with the sequence's dim (one no earlier sequence has taken, if
    any is left), prefer the one with the sequence's row count (the same id space), then the largest:
    a history of item ids pairs with the ``item`` table, not a small ``category`` table listed first.
    """
    pairs: dict[int, int] = {}
    for s, seq in enumerate(spec.tables):
        if seq.kind != "sequence":
            continue
        matches = [i for i, t in enumerate(spec.tables) if _is_candidate_for(t, seq)]
        if not matches:
            raise SpecError(
                f"model {spec.name!r}: sequence table {seq.name!r} (dim {seq.dim}) needs a candidate: "
                f"a table with kind 'pooled', side 'item' and dim {seq.dim}; none found"
            )
        free = [i for i in matches if i not in pairs.values()] or matches
        pairs[s] = min(free, key=lambda i: (spec.tables[i].rows != seq.rows, -spec.tables[i].rows, i))
    if not pairs:
        raise SpecError(f"model {spec.name!r}: family {spec.family!r} needs a table of kind 'sequence'")
    return pairs


def _is_candidate_for(table: TableSpec, seq: TableSpec) -> bool:
    return table.kind == "pooled" and table.side == "item" and table.dim == seq.dim


class ActivationUnit(nn.Module):
    """DIN's local activation unit: MLP over ``[k, q, k - q, k * q]`` → one weight per step.

    The first layer is held as ``nn.Linear(4d, w1)`` (the paper's parameters) but evaluated factored:
    ``[k, q, k-q, k*q] W^T = [k, k*q] [W_k + W_d, W_p]^T + q (W_q - W_d)^T`` — the query part is
    computed once per sample instead of once per step, halving the dominant matmul.
    """

    def __init__(self, dim: int, widths: tuple[int, ...]) -> None:
        super().__init__()
        widths = tuple(int(w) for w in widths) or DEFAULT_ATTENTION_MLP
        if widths[-1] != 1:
            widths = (*widths, 1)
        self.dim = dim
        self.first = nn.Linear(4 * dim, widths[0])
        self.first_act = nn.ReLU() if len(widths) > 1 else nn.Identity()
        self.rest = mlp(widths[1:], widths[0], last_activation=False)

    def forward(self, keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """``keys`` [B, L, d], ``query`` [B, d] → unnormalised scores [B, L]."""
        w_k, w_q, w_d, w_p = self.first.weight.split(self.dim, dim=1)
        per_step = torch.cat([keys, keys * query.unsqueeze(1)], dim=-1)
        z = per_step @ torch.cat([w_k + w_d, w_p], dim=1).t()
        z = z + (query @ (w_q - w_d).t() + self.first.bias).unsqueeze(1)
        return self.rest(self.first_act(z)).squeeze(-1)

    def reference(self, keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The unfactored form, for tests."""
        q = query.unsqueeze(1).expand_as(keys)
        z = self.first(torch.cat([keys, q, keys - q, keys * q], dim=-1))
        return self.rest(self.first_act(z)).squeeze(-1)

    def dense_flops(self, inputs: tuple[torch.Tensor, ...], _output: object) -> int:
        keys = inputs[0]
        steps, samples = keys.numel() // self.dim, keys.shape[0]
        w1 = self.first.out_features
        # k*q product + the [k, k*q] matmul per step; the query matmul per sample.  ``rest`` is hooked.
        return steps * self.dim + 2 * steps * 2 * self.dim * w1 + 2 * samples * self.dim * w1


class WeightedSum(nn.Module):
    """``sum_l w[b, l] * keys[b, l, :]`` (DIN's attention pooling; DIEN's attention is softmaxed first)."""

    def forward(self, keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return torch.bmm(weights.unsqueeze(1), keys).squeeze(1)

    def dense_flops(self, inputs: tuple[torch.Tensor, ...], _output: object) -> int:
        return 2 * inputs[0].numel()


class DotScores(nn.Module):
    """``keys · query`` per step (DIEN's bilinear attention once the query is projected): [B, L]."""

    def forward(self, keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        return torch.bmm(keys, query.unsqueeze(2)).squeeze(2)

    def dense_flops(self, inputs: tuple[torch.Tensor, ...], _output: object) -> int:
        return 2 * inputs[0].numel()


class AUGRU(nn.Module):
    """GRU with attentional update gate (DIEN, Zhou et al., AAAI'19, Eq. 6):

    ``u'_t = a_t * u_t``;  ``h_t = (1 - u'_t) * h_{t-1} + u'_t * h~_t``.

    Input projections for all steps run as one ``nn.Linear`` on ``[B, L, in]`` (hooked by
    ``zoo.flops``); the recurrence is an explicit loop over time steps (TorchScript, about 2x faster
    than eager at batch 1) using ``h_proj``'s weights, counted by :meth:`dense_flops`.
    Gate order in the projections is (reset, update, candidate) like ``nn.GRUCell``; note ``u`` here
    is DIEN's "move towards the new state" gate, i.e. ``1 - z`` of PyTorch's GRU.
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.x_proj = nn.Linear(input_size, 3 * hidden_size)
        self.h_proj = nn.Linear(hidden_size, 3 * hidden_size)

    def forward(self, x: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """``x`` [B, L, in], ``attention`` [B, L] → final hidden state [B, H]."""
        batch, steps, _ = x.shape
        gates = self.x_proj(x).view(batch, steps, 3, self.hidden_size)
        x_r, x_u, x_n = gates.unbind(2)
        h0 = x.new_zeros(batch, self.hidden_size)
        return _augru_loop()(x_r, x_u, x_n, attention.unsqueeze(-1), self.h_proj.weight.t(), self.h_proj.bias, h0)

    def dense_flops(self, inputs: tuple[torch.Tensor, ...], _output: object) -> int:
        x = inputs[0]
        return 2 * (x.numel() // x.shape[-1]) * self.hidden_size * 3 * self.hidden_size


def _augru_steps(
    x_r: torch.Tensor, x_u: torch.Tensor, x_n: torch.Tensor, att: torch.Tensor,
    w_h: torch.Tensor, b_h: torch.Tensor, h: torch.Tensor,
) -> torch.Tensor:
    for t in range(x_r.shape[1]):
        h_r, h_u, h_n = torch.addmm(b_h, h, w_h).chunk(3, 1)
        r = torch.sigmoid(x_r[:, t] + h_r)
        u = torch.sigmoid(x_u[:, t] + h_u) * att[:, t]
        n = torch.tanh(torch.addcmul(x_n[:, t], r, h_n))
        h = torch.addcmul(h, u, n - h)
    return h


@cache
def _augru_loop():
    """The AUGRU recurrence compiled once, on first use (not at import); eager if TorchScript is gone."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(_augru_steps)
    except Exception:  # noqa: BLE001 - any scripting failure: the eager loop computes the same
        return _augru_steps
