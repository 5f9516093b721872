"""NCF / NeuMF (He et al., WWW'17): GMF (user ⊙ item embedding) and an MLP tower, fused by one layer.

Table roles come from ``side``: GMF multiplies the first user-side and the first item-side pooled
table of equal dim.  The MLP tower takes ``concat(bottom(dense), every other table)``; when the spec
has no other tables the tower shares the GMF pair's embeddings (NCF without separate MLP embeddings).
``top_mlp`` is the MLP tower; if it ends in ``towers`` that last layer is read as the NeuMF prediction
layer, which always sees ``concat(gmf, tower)``.
"""

from __future__ import annotations

import torch
from torch import nn

from recserve.errors import SpecError
from recserve.specs import ModelSpec
from recserve.zoo.base import RecModel, mlp
from recserve.zoo.layers import mlp_out, sum_sequences


def gmf_pair(spec: ModelSpec) -> tuple[int, int]:
    users = [i for i, t in enumerate(spec.tables) if t.side == "user" and t.kind == "pooled"]
    items = [i for i, t in enumerate(spec.tables) if t.side == "item" and t.kind == "pooled"]
    for u in users:
        for i in items:
            if spec.tables[u].dim == spec.tables[i].dim:
                return u, i
    raise SpecError(
        f"model {spec.name!r}: NCF's GMF needs a pooled user-side and a pooled item-side table of the "
        f"same dim (user dims {[spec.tables[u].dim for u in users]}, item dims {[spec.tables[i].dim for i in items]})"
    )


class NCF(RecModel):
    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__(spec, rows)
        self.user, self.item = gmf_pair(spec)
        others = [t for t in range(len(spec.tables)) if t not in (self.user, self.item)]
        self.mlp_tables = others or [self.user, self.item]
        self.bottom = mlp(spec.bottom_mlp, spec.dense_in)
        tower_in = mlp_out(spec.bottom_mlp, spec.dense_in) + sum(spec.tables[t].dim for t in self.mlp_tables)
        widths = spec.top_mlp[:-1] if spec.top_mlp[-1] == spec.towers else spec.top_mlp
        self.tower = mlp(widths, tower_in)
        self.predict = nn.Linear(spec.tables[self.user].dim + mlp_out(widths, tower_in), spec.towers)

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        pooled = sum_sequences(pooled)
        gmf = pooled[self.user] * pooled[self.item]
        tower = self.tower(torch.cat([self.bottom(dense), *(pooled[t] for t in self.mlp_tables)], dim=1))
        return torch.sigmoid(self.predict(torch.cat([gmf, tower], dim=1)))
