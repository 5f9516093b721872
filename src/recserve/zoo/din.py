"""DIN (Zhou et al., KDD'18) and DIEN (Zhou et al., AAAI'19): attention over a behaviour sequence.

Each ``sequence`` table ``[B, L, d]`` is a user's behaviour history; its candidate item is a pooled
item-side table of the same dim (``layers.candidate_tables``).  DIN weights the history by the
activation unit's scores (unnormalised, as in the paper) and sums it.  DIEN runs a GRU over the
history (interest extractor), scores each hidden state against the candidate (softmax over steps)
and evolves the interest with an AUGRU whose final state is the user interest.  Both concatenate
the interests with ``bottom(dense)`` and every pooled embedding and score through ``top_mlp``.
"""

from __future__ import annotations

import torch
from torch import nn

from recserve.specs import ModelSpec
from recserve.zoo.base import RecModel, mlp
from recserve.zoo.layers import (
    AUGRU,
    ActivationUnit,
    DotScores,
    ScoreHead,
    WeightedSum,
    candidate_tables,
    mlp_out,
)


class _InterestModel(RecModel):
    """Shared layout: per-sequence interest units, then a head over everything pooled."""

    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__(spec, rows)
        self.candidates = candidate_tables(spec)
        self.bottom = mlp(spec.bottom_mlp, spec.dense_in)
        pooled_dims = sum(t.dim for t in spec.tables if t.kind == "pooled")
        self.head_in = mlp_out(spec.bottom_mlp, spec.dense_in) + pooled_dims

    def _make_head(self, interest_dims: int) -> None:
        self.head = ScoreHead(self.spec.top_mlp, self.head_in + interest_dims, self.spec.towers)

    def interest(self, unit: int, history: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        interests = [
            self.interest(k, pooled[s], pooled[c]) for k, (s, c) in enumerate(self.candidates.items())
        ]
        flat = [e for t, e in enumerate(pooled) if t not in self.candidates]
        z = torch.cat([self.bottom(dense), *flat, *interests], dim=1)
        return torch.sigmoid(self.head(z))


class DIN(_InterestModel):
    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__(spec, rows)
        dims = [spec.tables[s].dim for s in self.candidates]
        self.attention = nn.ModuleList(ActivationUnit(d, spec.attention_mlp) for d in dims)
        self.pool = WeightedSum()
        self._make_head(sum(dims))

    def interest(self, unit: int, history: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        return self.pool(history, self.attention[unit](history, candidate))


class DIEN(_InterestModel):
    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__(spec, rows)
        hidden = spec.gru_hidden if spec.gru_hidden > 0 else max(t.dim for t in spec.sequence_tables)
        dims = [spec.tables[s].dim for s in self.candidates]
        self.extractors = nn.ModuleList(nn.GRU(d, hidden, batch_first=True) for d in dims)
        # candidate → hidden space: the bilinear W of DIEN's Eq. 5, or a projection for the MLP unit
        self.query = nn.ModuleList(nn.Linear(d, hidden, bias=False) for d in dims)
        self.attention = (
            nn.ModuleList(ActivationUnit(hidden, spec.attention_mlp) for _ in dims) if spec.attention_mlp else None
        )
        self.dot = DotScores()
        self.evolvers = nn.ModuleList(AUGRU(hidden, hidden) for _ in dims)
        self._make_head(hidden * len(dims))

    def interest(self, unit: int, history: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
        states, _ = self.extractors[unit](history)
        query = self.query[unit](candidate)
        if self.attention is not None:
            scores = self.attention[unit](states, query)
        else:
            scores = self.dot(states, query)
        return self.evolvers[unit](states, torch.softmax(scores, dim=1))
