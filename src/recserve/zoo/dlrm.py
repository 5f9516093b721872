"""DLRM (Naumov et al.): bottom MLP on dense features, sum-pooled tables, dot or concat
interaction, top MLP with a sigmoid score."""

from __future__ import annotations

import torch

from recserve.specs import ModelSpec
from recserve.zoo.base import RecModel, mlp


class DLRM(RecModel):
    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__(spec, rows)
        self.bottom = mlp(spec.bottom_mlp, spec.dense_in)
        bottom_out = spec.bottom_mlp[-1] if spec.bottom_mlp else spec.dense_in
        n = len(spec.tables) + 1
        if spec.interaction == "dot":
            top_in = bottom_out + n * (n - 1) // 2
            tri = torch.triu_indices(n, n, offset=1)
            self.register_buffer("tri_i", tri[0], persistent=False)
            self.register_buffer("tri_j", tri[1], persistent=False)
        else:
            top_in = bottom_out + sum(t.dim for t in spec.tables)
        self.top = mlp(spec.top_mlp, top_in, last_activation=False)

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        if self.spec.interaction == "dot":
            feats = torch.stack([x, *pooled], dim=1)  # [B, n, d]
            inter = torch.bmm(feats, feats.transpose(1, 2))[:, self.tri_i, self.tri_j]
            z = torch.cat([x, inter], dim=1)
        else:
            z = torch.cat([x, *pooled], dim=1)
        return torch.sigmoid(self.top(z))
