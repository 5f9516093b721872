"""A repository version's check runs the user's model in a child process (``check_in_child``): a model that
crashes when it loads is refused, naming how its checking process died, and the server process lives on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from recserve.serving.node.artifact_check import check_in_child
from recserve.serving.node.forkserver import mp_context
from recserve.zoo.artifacts import ArtifactError, artifact_spec

SPEC = """family: program
interaction: program
dense_in: 4
towers: 1
tables:
- {name: t0, rows: 100, dim: 4, pooling: 1}
- {name: t1, rows: 100, dim: 4, pooling: 1}
"""


class Good(nn.Module):
    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(dense.sum(1, keepdim=True)) + 0.0 * values.sum().float() + 0.0 * lengths.sum().float()


class Raises(nn.Module):
    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this model refuses every batch")


class Crashes(nn.Module):
    """Dereferences far outside a tensor (a sparse index no op checks): the process running it dies."""

    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        wild = torch.ops.aten._sparse_coo_tensor_unsafe(torch.tensor([[1 << 40]]), torch.ones(1), [4]).to_dense()
        return torch.sigmoid(dense.sum(1, keepdim=True)) + wild.sum()


def version(tmp_path: Path, module: nn.Module) -> tuple[Path, object]:
    folder = tmp_path / type(module).__name__ / "1"
    folder.mkdir(parents=True)
    (folder / "spec.yaml").write_text(SPEC)
    artifact = folder / "model.pt"
    torch.jit.save(torch.jit.script(module.eval()), str(artifact))
    return artifact, artifact_spec(artifact, type(module).__name__, {"sla": {"target_ms": 50, "percentile": 95}})


def test_a_good_model_passes_and_a_raising_one_is_refused_with_its_reason(tmp_path):
    context = mp_context()
    check_in_child(context, *version(tmp_path, Good()))
    artifact, spec = version(tmp_path, Raises())
    with pytest.raises(ArtifactError, match="raised .*this model refuses every batch") as refused:
        check_in_child(context, artifact, spec)
    assert refused.value.path == str(artifact)


def test_a_model_that_kills_its_process_is_refused_and_this_process_lives_on(tmp_path):
    artifact, spec = version(tmp_path, Crashes())
    with pytest.raises(ArtifactError) as refused:
        check_in_child(mp_context(), artifact, spec)
    # where torch checks the index the model raises instead; either way the model is refused, here
    assert "killed by SIGSEGV" in refused.value.reason or "raised" in refused.value.reason


def test_the_check_says_the_largest_batch_an_exported_program_takes(tmp_path):
    folder = tmp_path / "bounded" / "1"
    folder.mkdir(parents=True)
    (folder / "spec.yaml").write_text(SPEC)
    example = (torch.randn(4, 4), torch.randint(0, 100, (8,)), torch.ones(2, 4, dtype=torch.int32))
    for bound in (64, None):
        batch = torch.export.Dim("batch", min=1, max=bound) if bound else torch.export.Dim("batch", min=1)
        program = torch.export.export(Good().eval(), example,
                                      dynamic_shapes=({0: batch}, {0: torch.export.Dim("ids", min=1)}, {1: batch}))
        torch.export.save(program, str(folder / "model.pt2"))
        spec = artifact_spec(folder / "model.pt2", "bounded", {"sla": {"target_ms": 50, "percentile": 95}})
        assert check_in_child(mp_context(), folder / "model.pt2", spec) == bound
