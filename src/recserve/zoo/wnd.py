"""Wide & Deep (Cheng et al., DLRS'16) and its multi-task variant (MT-WnD, Zhao et al., RecSys'19).

Wide part: one linear layer over ``concat(dense, pooled embeddings)``.  Deep part: ``top_mlp`` over
``concat(bottom(dense), pooled embeddings)``.  The score is ``sigmoid(wide + deep)`` per tower.
Sequence tables, if a spec has any, are sum-pooled like ordinary bags.
"""

from __future__ import annotations

import torch
from torch import nn

from recserve.specs import ModelSpec
from recserve.zoo.base import RecModel, mlp
from recserve.zoo.layers import ScoreHead, mlp_out, sum_sequences


class _WideDeepBase(RecModel):
    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__(spec, rows)
        emb = sum(t.dim for t in spec.tables)
        self.bottom = mlp(spec.bottom_mlp, spec.dense_in)
        self.deep_in = mlp_out(spec.bottom_mlp, spec.dense_in) + emb
        self.wide = nn.Linear(spec.dense_in + emb, spec.towers)

    def _inputs(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = sum_sequences(pooled)
        wide = self.wide(torch.cat([dense, *pooled], dim=1))
        return wide, torch.cat([self.bottom(dense), *pooled], dim=1)


class WideAndDeep(_WideDeepBase):
    """Scores ``[B, towers]`` (one tower unless the spec asks for more)."""

    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__(spec, rows)
        self.deep = ScoreHead(spec.top_mlp, self.deep_in, spec.towers)

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        wide, deep_in = self._inputs(dense, pooled)
        return torch.sigmoid(wide + self.deep(deep_in))


class MultiTaskWideAndDeep(_WideDeepBase):
    """A shared deep trunk (``top_mlp``, all layers ReLU) feeding ``towers`` heads (``tower_mlp`` → 1)."""

    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__(spec, rows)
        self.trunk = mlp(spec.top_mlp, self.deep_in)
        trunk_out = mlp_out(spec.top_mlp, self.deep_in)
        self.heads = nn.ModuleList(ScoreHead(spec.tower_mlp, trunk_out, 1) for _ in range(spec.towers))

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        wide, deep_in = self._inputs(dense, pooled)
        shared = self.trunk(deep_in)
        deep = torch.cat([head(shared) for head in self.heads], dim=1)
        return torch.sigmoid(wide + deep)
