"""DLRM (Naumov et al.): bottom MLP on dense features, sum-pooled tables, dot or concat
interaction, top MLP with a sigmoid score."""

from __future__ import annotations

import torch
from torch import nn

from recserve.specs import ModelSpec
from recserve.zoo.base import RecModel, mlp
from recserve.zoo.layers import ScoreHead, sum_sequences


class DotInteraction(nn.Module):
    """Pairwise dot products of the ``n`` feature vectors (upper triangle, no diagonal)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        tri = torch.triu_indices(n, n, offset=1, device="cpu")  # CPU even when built on meta (flops)
        # each pair (i, j) as one index into the flattened [n, n] products: one index_select instead of indexing
        # two dims: several times faster, the same values
        self.register_buffer("pairs", tri[0] * n + tri[1], persistent=False)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """``feats`` [B, n, d] → [B, n(n-1)/2]."""
        products = torch.bmm(feats, feats.transpose(1, 2))
        return torch.index_select(products.reshape(products.shape[0], -1), 1, self.pairs)

    def dense_flops(self, inputs: tuple[torch.Tensor, ...], _output: object) -> int:
        b, n, d = inputs[0].shape
        return 2 * b * n * n * d


class DLRM(RecModel):
    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__(spec, rows)
        self.bottom = mlp(spec.bottom_mlp, spec.dense_in)
        bottom_out = spec.bottom_mlp[-1] if spec.bottom_mlp else spec.dense_in
        n = len(spec.tables) + 1
        if spec.interaction == "dot":
            top_in = bottom_out + n * (n - 1) // 2
            self.interaction = DotInteraction(n)
        else:
            top_in = bottom_out + sum(t.dim for t in spec.tables)
        self.top = ScoreHead(spec.top_mlp, top_in, spec.towers)

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = sum_sequences(pooled)
        if self.spec.interaction == "dot":
            z = torch.cat([x, self.interaction(torch.stack([x, *pooled], dim=1))], dim=1)
        else:
            z = torch.cat([x, *pooled], dim=1)
        return torch.sigmoid(self.top(z))
