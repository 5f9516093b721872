"""Model repository (#15): the user's trained models as files, served, swapped and refused when broken."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import threading
import time
from pathlib import Path

import aiohttp
import grpc
import numpy as np
import pytest
import torch
from torch import nn
from tritonclient.utils import InferenceServerException

from recserve.errors import SpecError
from recserve.serving.node.config import NodeConfig
from recserve.serving.node.repository import Repository, VersionPolicy, parse_policy
from recserve.specs import model_from_dict, to_dict
from recserve.zoo import FAMILY_CLASSES, random_batch, sample_batch
from recserve.zoo.artifacts import (
    SPEC_EXTRA,
    ArtifactError,
    artifact_spec,
    check_artifact,
    load_artifact,
    write_version,
)
from tests.support import grpc_client, http
from tests.support.models import scores
from tests.support.nodes import generous, generous_yaml, started
from tests.support.oip_inputs import DTYPE_NAMES, grpc_inputs, http_inputs
from tests.support.scrape import metric_value, scrape
from tests.support.wait import until

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

SPEC = dict(family="dlrm", dense_in=8, bottom_mlp=[16, 8], top_mlp=[16, 1], interaction="dot",
            tables=[dict(name="t", rows=500, dim=8, pooling=2, repeat=3)], sla=dict(target_ms=50))
KINDS = {"ctr": "safetensors", "ctr_pt2": "export", "ctr_ts": "torchscript"}


def trained(seed: int, name: str = "ctr"):
    """A DLRM with weights of its own (``seed``) standing in for a trained one."""
    spec = model_from_dict(name, SPEC)
    torch.manual_seed(seed)
    return FAMILY_CLASSES["dlrm"](spec, tuple(t.rows for t in spec.tables)).eval()


class OwnArchitecture(nn.Module):
    """Not a zoo model: two tables of different widths, one MLP over everything, two towers; exported bare."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.user, self.item = nn.Parameter(torch.randn(300, 8) * 0.1), nn.Parameter(torch.randn(200, 4) * 0.1)
        self.mlp = nn.Sequential(nn.Linear(6 + 12, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        tables, batch = lengths.shape
        lens = lengths.to(torch.int64)
        offsets = torch.cat([lens.new_zeros(1), torch.cumsum(lens.reshape(-1), 0)])
        table_of = torch.repeat_interleave(torch.arange(tables), lens.sum(1), output_size=values.shape[0])
        pooled = []
        for t, weight in enumerate((self.user, self.item)):
            bags = nn.functional.embedding_bag(values.clamp(0, weight.shape[0] - 1), weight, offsets, mode="sum",
                                               per_sample_weights=(table_of == t).to(weight.dtype),
                                               include_last_offset=True)
            pooled.append(bags[t * batch:(t + 1) * batch])
        return torch.sigmoid(self.mlp(torch.cat([dense, *pooled], 1)))


def export_own(path: Path, max_batch: int = 1 << 20) -> nn.Module:
    """A torch.export program with nothing recserve-specific inside (no spec), for batches up to ``max_batch``."""
    module = OwnArchitecture().eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths = torch.tensor([[1, 2, 1, 1], [1, 1, 1, 1]], dtype=torch.int32)
    example = (torch.randn(4, 6), torch.randint(0, 200, (9,)), lengths)
    batch, ids = torch.export.Dim("batch", min=1, max=max_batch), torch.export.Dim("ids", min=1)
    program = torch.export.export(module, example, dynamic_shapes=({0: batch}, {0: ids}, {1: batch}))
    torch.export.save(program, str(path))
    return module


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for name, kind in KINDS.items():
        (root / name).mkdir()
        (root / name / "config.yaml").write_text(
            "workers: 1\nqueue_limit: 32\nsla: {target_ms: 20}\n" + generous_yaml())
        write_version(trained(0, name), root / name, 1, kind)
    (root / "swap").mkdir()
    (root / "swap" / "config.yaml").write_text(generous_yaml() + "workers: 1\nqueue_limit: 256\n"
                                               "version_policy: {latest: {num_versions: 1}}\n")
    write_version(trained(1, "swap"), root / "swap", 1, "safetensors")
    export_own(root / "own" / "1" / "model.pt2")
    shutil.copytree(root / "ctr_ts", root / "ctr_ts_pipeline")  # TorchScript exposes sparse() and dense()
    (root / "ctr_ts_pipeline" / "config.yaml").write_text(
        "mode: pipeline\nsparse_workers: 1\nworkers: 1\n" + generous_yaml())
    return root


# ---------------------------------------------------------------- artifacts in-process


@pytest.mark.parametrize("kind", ["safetensors", "export", "torchscript"])
def test_each_artifact_kind_scores_like_the_trained_model(repo, kind):
    name = next(n for n, k in KINDS.items() if k == kind)
    cfg = Repository(repo).model_config(name, 1)
    model = check_artifact(Path(cfg.artifact), cfg.spec)
    batch = sample_batch(trained(0, name), 33, rng=7)
    diff = np.abs(scores(model, batch) - scores(trained(0, name), batch)).max()
    print(f"{kind}: max abs diff {diff:.3g}")
    assert diff <= 1e-6
    assert cfg.spec.sla.target_ms == 20  # config.yaml's SLA wins over the spec's


def test_safetensors_tables_are_memory_mapped_from_the_file(repo):
    cfg = Repository(repo).model_config("ctr", 1)
    model = load_artifact(Path(cfg.artifact), cfg.spec)
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(cfg.artifact):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            spans.append((lo, hi))
    assert spans, "the weights file is not mapped"
    for table in model.tables:
        ptr = table.weight.data_ptr()
        assert any(lo <= ptr < hi for lo, hi in spans), "table rows were copied out of the mapped file"


def _corrupt(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


class Raising(nn.Module):
    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if bool(dense.sum() > -1e30):
            raise RuntimeError("feature store unreachable")
        return dense[:, :1]


class WrongWidth(nn.Module):
    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return dense[:, :3]


def _program(module: nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    spec = {k: v for k, v in to_dict(model_from_dict("x", SPEC)).items() if k != "name"}
    torch.jit.save(torch.jit.script(module), str(path), _extra_files={SPEC_EXTRA: json.dumps(spec)})


BROKEN = {
    "wrong shapes": (lambda d: (write_version(trained(0), d, 1, "safetensors"),
                                (d / "1" / "spec.yaml").write_text((d / "1" / "spec.yaml").read_text()
                                                                   .replace("rows: 500", "rows: 400"))),
                     "model.safetensors", "tensor 'tables.0.bag.weight' is torch.float32 [500, 8], the spec needs"),
    "corrupt file": (lambda d: _corrupt(write_version(trained(0), d, 1, "safetensors")),
                     "model.safetensors", "not a readable safetensors file"),
    "corrupt program": (lambda d: _corrupt(write_version(trained(0), d, 1, "torchscript")),
                        "model.pt", "cannot read the program"),
    "missing file": (lambda d: (d / "1").mkdir(parents=True), "1", "no model file"),
    "missing spec": (lambda d: (write_version(trained(0), d, 1, "safetensors"), (d / "1" / "spec.yaml").unlink()),
                     "model.safetensors", "no spec"),
    "program raises": (lambda d: _program(Raising(), d / "1" / "model.pt"), "model.pt",
                       "RuntimeError: feature store unreachable"),
    "wrong output": (lambda d: _program(WrongWidth(), d / "1" / "model.pt"), "model.pt",
                     "returned scores [2, 3], expected [2, 1]"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_artifact_is_refused_naming_the_file_and_reason(tmp_path, case):
    make, file_name, reason = BROKEN[case]
    make(tmp_path / "m")
    with pytest.raises(ArtifactError) as err:
        cfg = Repository(tmp_path).model_config("m", 1)
        check_artifact(Path(cfg.artifact), cfg.spec)
    print(f"{case}: {err.value}")
    assert str(tmp_path / "m" / "1") in str(err.value) and file_name in str(err.value)
    assert reason in str(err.value)


def test_a_file_that_is_no_export_archive_is_refused_in_one_line(tmp_path, caplog):
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.pt2").write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match="model.pt2: cannot read the program"):
        Repository(tmp_path).model_config("m", 1)
    assert not [r for r in caplog.records if "deserializing" in r.getMessage()]  # torch's traceback, not logged


def test_program_artifacts_refuse_the_sparse_dense_split(repo, tmp_path):
    shutil.copytree(repo / "ctr_ts", tmp_path / "t")
    (tmp_path / "t" / "config.yaml").write_text(f"tiering: {{dir: {tmp_path}, tables: all}}\n")
    with pytest.raises(SpecError, match="tiering needs a sparse/dense split; a TorchScript module holds its tables"):
        Repository(tmp_path).model_config("t", 1)
    shutil.copytree(repo / "ctr_pt2", tmp_path / "p")
    (tmp_path / "p" / "config.yaml").write_text("mode: pipeline\n")
    with pytest.raises(SpecError, match="needs a sparse/dense split; a torch.export program is one opaque"):
        Repository(tmp_path).model_config("p", 1)
    (tmp_path / "p" / "config.yaml").write_text(f"tiering: {{dir: {tmp_path}, tables: all}}\n")
    with pytest.raises(SpecError, match="tiering needs a sparse/dense split"):
        Repository(tmp_path).model_config("p", 1)
    shutil.copytree(repo / "ctr", tmp_path / "s")
    (tmp_path / "s" / "config.yaml").write_text("mode: pipeline\nsparse_workers: 1\n")
    assert Repository(tmp_path).model_config("s", 1).mode == "pipeline"  # safetensors: the zoo model splits


def test_version_policy_and_config_errors(tmp_path):
    assert VersionPolicy().select([3, 1, 2]) == [3]
    assert parse_policy({"latest": {"num_versions": 2}}, "x").select([1, 2, 3]) == [2, 3]
    assert parse_policy({"all": {}}, "x").select([2, 1]) == [1, 2]
    assert parse_policy({"specific": {"versions": [1, 3]}}, "x").select([1, 2, 3]) == [1, 3]
    with pytest.raises(SpecError, match=r"x: version_policy.newest: unknown field; allowed: \['all', 'latest', 's"):
        parse_policy({"newest": {}}, "x")
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.yaml").write_text("workerz: 2\n")
    with pytest.raises(SpecError, match=r"config.yaml: workerz: unknown field \(did you mean 'workers'\?\)"):
        Repository(tmp_path).settings("m")


def test_a_bare_program_describes_itself(repo):
    """No spec inside or beside it: inputs, tables, towers and dense FLOPs are read off the program."""
    spec = artifact_spec(repo / "own" / "1" / "model.pt2", "own")
    assert (spec.family, spec.dense_in, spec.towers) == ("program", 6, 2)
    assert [(t.rows, t.dim) for t in spec.tables] == [(300, 8), (200, 4)]
    assert spec.dense_flops == 2 * (18 * 16 + 16 * 2)  # two Linear layers per item; lookups are not FLOPs
    assert spec.dense_params == 18 * 16 + 16 + 16 * 2 + 2
    module = check_artifact(repo / "own" / "1" / "model.pt2", spec)
    batch = random_batch(6, (300, 200), (1, 1), 5, 1)
    with torch.inference_mode():
        want = OwnArchitecture()(batch.dense, batch.values, batch.lengths).numpy()
    assert np.abs(scores(module, batch) - want).max() <= 1e-6


def test_program_spec_comes_from_inside_the_program(repo):
    spec = artifact_spec(repo / "ctr_pt2" / "1" / "model.pt2", "renamed")
    assert spec.name == "renamed" and [t.rows for t in spec.tables] == [500, 500, 500]


# ---------------------------------------------------------------- served


@pytest.fixture(scope="module")
def node(repo):
    with started(NodeConfig(models=[], repository=str(repo))) as server:
        yield server, server.ports


def test_served_scores_equal_the_trained_model_over_http_and_grpc(node):
    _, ports = node
    over_http, over_grpc = http.triton(ports.http), grpc_client.triton(ports.grpc)
    for name, kind in KINDS.items():
        reference = trained(0, name)
        batch = sample_batch(reference, 17, rng=3)
        want = scores(reference, batch)
        via_http = over_http.infer(name, http_inputs(batch)).as_numpy("scores")
        via_grpc = over_grpc.infer(name, grpc_inputs(batch), model_version="1").as_numpy("scores")
        diffs = np.abs(via_http - want).max(), np.abs(via_grpc - want).max()
        print(f"{name} ({kind}): max abs diff HTTP {diffs[0]:.3g}, gRPC {diffs[1]:.3g}")
        assert max(diffs) <= 1e-6


def test_a_bare_program_of_its_own_architecture_is_served(node):
    _, ports = node
    batch = random_batch(6, (300, 200), (1, 1), 7, 2)
    with torch.inference_mode():
        want = OwnArchitecture()(batch.dense, batch.values, batch.lengths).numpy()
    served = grpc_client.triton(ports.grpc).infer("own", grpc_inputs(batch))
    assert np.abs(served.as_numpy("scores") - want).max() <= 1e-6


def test_a_torchscript_module_with_sparse_and_dense_methods_serves_as_a_pipeline(node):
    server, ports = node
    state = server.call(_state(server, "ctr_ts_pipeline"))
    assert state["mode"] == "pipeline" and set(state["stages"]) == {"sparse", "dense"}
    reference = trained(0, "ctr_ts_pipeline")
    batch = sample_batch(reference, 12, rng=8)
    served = http.triton(ports.http).infer("ctr_ts_pipeline", http_inputs(batch))
    assert np.abs(served.as_numpy("scores") - scores(reference, batch)).max() <= 1e-6


async def _state(server, name: str) -> dict:
    return server.core.runtime(name).state()


def test_repository_index_versioned_paths_and_unload_load(node, caplog):
    caplog.set_level(logging.INFO, logger="recserve")
    _, ports = node
    status, index = http.post_json(ports.http, "/v2/repository/index", timeout_s=120).status_and_json()
    assert status == 200
    assert {(e["name"], e["version"], e["state"]) for e in index} >= {(n, "1", "READY") for n in KINDS}
    reference = trained(0, "ctr_ts")
    batch = sample_batch(reference, 4, rng=1)
    over_http = http.triton(ports.http)
    result = over_http.infer("ctr_ts", http_inputs(batch), model_version="1")
    assert result.get_response()["model_version"] == "1"
    with pytest.raises(Exception, match="no version '9' loaded"):
        over_http.infer("ctr_ts", http_inputs(batch), model_version="9")
    over_grpc = grpc_client.triton(ports.grpc)
    over_grpc.unload_model("ctr_ts")
    assert not over_http.is_model_ready("ctr_ts")
    assert "model ctr_ts unloaded: version(s) 1 retire" in caplog.text  # the operator reads it in the log
    index = over_grpc.get_model_repository_index(as_json=True)["models"]  # proto JSON leaves out empty fields
    states = {e["name"]: (e.get("state", ""), e.get("reason", "")) for e in index}
    assert states["ctr_ts"] == ("UNAVAILABLE", "unloaded")
    over_http.load_model("ctr_ts")
    served = over_http.infer("ctr_ts", http_inputs(batch)).as_numpy("scores")
    assert np.abs(served - scores(reference, batch)).max() <= 1e-6


def test_broken_new_version_is_refused_and_the_old_keeps_serving(node, repo):
    _, ports = node
    target = repo / "ctr_ts" / "2"
    target.mkdir()
    try:
        (target / "model.pt").write_bytes(b"not a torchscript archive")
        status, body = http.post_json(ports.http, "/v2/repository/models/ctr_ts/load", timeout_s=120).status_and_json()
        print(body)
        assert status == 400 and "ctr_ts/2/model.pt" in body["error"] and str(repo) not in body["error"]
        assert "cannot read the program" in body["error"]
        _, index = http.post_json(ports.http, "/v2/repository/index", timeout_s=120).status_and_json()
        entry = next(e for e in index if e["name"] == "ctr_ts" and e["version"] == "2")
        assert entry["state"] == "UNAVAILABLE" and "cannot read the program" in entry["reason"]
        reference = trained(0, "ctr_ts")
        batch = sample_batch(reference, 3, rng=2)
        answer = http.triton(ports.http).infer("ctr_ts", http_inputs(batch))
        assert answer.get_response()["model_version"] == "1"
        assert np.abs(answer.as_numpy("scores") - scores(reference, batch)).max() <= 1e-6
        assert http.triton(ports.http).is_server_ready()  # the model serves: a failed new version does not count
    finally:
        shutil.rmtree(target)


def test_a_load_reloads_a_version_whose_files_changed_and_keeps_it_when_the_new_files_fail(node, repo, tmp_path,
                                                                                             caplog):
    """Triton's load of a loaded model: a version whose files were overwritten is loaded again and replaces the
    one serving; if the new files fail their check, the loaded version keeps serving and the index says why."""
    _, ports = node
    shutil.copytree(repo / "ctr_ts", repo / "retrained")
    client = http.triton(ports.http)

    def load() -> tuple[int, dict]:
        return http.post_json(ports.http, "/v2/repository/models/retrained/load", timeout_s=120).status_and_json()

    def served_like(seed: int) -> bool:
        batch = sample_batch(trained(seed, "ctr_ts"), 3, rng=4)
        answer = client.infer("retrained", http_inputs(batch)).as_numpy("scores")
        return float(np.abs(answer - scores(trained(seed, "ctr_ts"), batch)).max()) <= 1e-6

    try:
        assert load()[0] == 200 and served_like(0)
        assert load()[0] == 200 and served_like(0)  # nothing changed: nothing reloaded
        write_version(trained(1, "ctr_ts"), tmp_path / "new", 1, "torchscript")
        shutil.copy(tmp_path / "new" / "1" / "model.pt", repo / "retrained" / "1" / "model.pt")
        assert load()[0] == 200
        assert served_like(1)
        (repo / "retrained" / "1" / "model.pt").write_bytes(b"not a torchscript archive")
        caplog.set_level("WARNING", logger="recserve.serving")
        status, body = load()
        assert any("reloading its changed files failed; the files loaded before serve on" in r.getMessage()
                   for r in caplog.records)
        assert status == 400 and "cannot read the program" in body["error"]
        assert served_like(1)
        index = http.post_json(ports.http, "/v2/repository/index", timeout_s=60).json()
        entry = next(e for e in index if e["name"] == "retrained" and e["version"] == "1")
        assert entry["state"] == "READY" and "reloading failed" in entry["reason"]
    finally:
        http.post_json(ports.http, "/v2/repository/models/retrained/unload", timeout_s=120)
        shutil.rmtree(repo / "retrained")


def test_a_reloaded_versions_counters_go_on_from_the_replaced_ones(node, repo, tmp_path):
    """A version reloaded for its changed files keeps its series (same model and version labels): its counters
    continue from the replaced runtime's, as Prometheus requires of a counter, rather than restarting at 0."""
    _, ports = node
    shutil.copytree(repo / "ctr_ts", repo / "recounted")
    client = http.triton(ports.http)

    def load() -> int:
        return http.post_json(ports.http, "/v2/repository/models/recounted/load", timeout_s=120).status

    def successes() -> float | None:
        return metric_value(scrape(ports.http), "recserve_request_success_total", model="recounted", version="1")

    try:
        assert load() == 200
        for _ in range(3):
            client.infer("recounted", http_inputs(sample_batch(trained(0, "ctr_ts"), 3, rng=4)))
        assert until(successes, lambda count: count == 3) == 3
        write_version(trained(1, "ctr_ts"), tmp_path / "new", 1, "torchscript")
        shutil.copy(tmp_path / "new" / "1" / "model.pt", repo / "recounted" / "1" / "model.pt")
        assert load() == 200
        assert successes() == 3
        client.infer("recounted", http_inputs(sample_batch(trained(0, "ctr_ts"), 3, rng=4)))
        assert until(successes, lambda count: count == 4) == 4
    finally:
        http.post_json(ports.http, "/v2/repository/models/recounted/unload", timeout_s=120)
        shutil.rmtree(repo / "recounted")


def test_a_program_exported_for_a_bounded_batch_serves_with_that_bound(node, repo):
    """``Dim("batch", max=64)``: a batch of 65 is the client's error (400 naming the bound), not the program's 500."""
    _, ports = node
    export_own(repo / "bounded" / "1" / "model.pt2", max_batch=64)
    try:
        assert http.post_json(ports.http, "/v2/repository/models/bounded/load", timeout_s=120).status == 200
        config = http.get_json(ports.http, "/v2/models/bounded/config")
        assert config["parameters"]["max_query_size"] == {"string_value": "64"}  # Triton's dims are the full shape
        client = http.triton(ports.http)
        answer = client.infer("bounded", http_inputs(random_batch(6, (300, 200), (1, 1), 64, 1)))
        assert answer.as_numpy("scores").shape == (64, 2)
        with pytest.raises(InferenceServerException, match="batch 65 exceeds max_batch_size 64"):
            client.infer("bounded", http_inputs(random_batch(6, (300, 200), (1, 1), 65, 1)))
    finally:
        http.post_json(ports.http, "/v2/repository/models/bounded/unload", timeout_s=120)
        shutil.rmtree(repo / "bounded")


class ValueFaults(nn.Module):
    """Scores ``[B, 1]``, but the wrong shape for a batch whose first feature is 666 and NaN for 777."""

    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        scores = torch.sigmoid(dense.sum(1, keepdim=True)) + 0.0 * values.sum().float() + 0.0 * lengths.sum().float()
        if bool(dense[0, 0] == 666.0):
            return scores[:1]
        if bool(dense[0, 0] == 777.0):
            return scores * float("nan")
        return scores


def test_scores_that_break_the_contract_fail_over_http_and_grpc_and_count_as_failures(node, repo):
    """Checked on every pass whichever way the query came (a worker's own HTTP, the server's gRPC service over the
    pipe): an error naming the fault, counted a failure, never OK with the wrong scores."""
    _, ports = node
    folder = repo / "faulty" / "1"
    folder.mkdir(parents=True)
    (folder / "spec.yaml").write_text("family: program\ninteraction: program\ndense_in: 4\ntowers: 1\ntables:\n"
                                      "- {name: t0, rows: 100, dim: 4, pooling: 1}\n"
                                      "- {name: t1, rows: 100, dim: 4, pooling: 1}\n")
    torch.jit.save(torch.jit.script(ValueFaults().eval()), str(folder / "model.pt"))
    try:
        assert http.post_json(ports.http, "/v2/repository/models/faulty/load", timeout_s=120).status == 200
        over_http, over_grpc = http.triton(ports.http), grpc_client.triton(ports.grpc)
        for poison, said in ((666.0, "returned scores [1, 1] for 2 item(s)"), (777.0, "non-finite")):
            batch = random_batch(4, (100, 100), (1, 1), 2, 3)
            batch.dense[0, 0] = poison
            with pytest.raises(InferenceServerException, match=re.escape(said)):
                over_http.infer("faulty", http_inputs(batch))
            with pytest.raises(InferenceServerException, match=re.escape(said)):
                over_grpc.infer("faulty", grpc_inputs(batch))
        good = random_batch(4, (100, 100), (1, 1), 2, 3)
        assert over_grpc.infer("faulty", grpc_inputs(good)).as_numpy("scores").shape == (2, 1)

        def counts() -> tuple[int, int]:
            stats = http.get_json(ports.http, "/v2/models/faulty/stats")["model_stats"][0]["inference_stats"]
            return stats["success"]["count"], stats["fail"]["count"]

        assert until(counts, lambda got: got == (1, 4), timeout_s=30) == (1, 4)  # 1 success, 4 failures
    finally:
        http.post_json(ports.http, "/v2/repository/models/faulty/unload", timeout_s=120)
        shutil.rmtree(repo / "faulty")


@pytest.mark.parametrize("strict", [True, False])
def test_a_model_that_failed_to_load_keeps_the_node_unready_until_loaded_or_unloaded(tmp_path, strict):
    """Triton's strict readiness: ready (HTTP and gRPC) only while no repository model failed to load and serves
    no version; loading it once fixed, or unloading it, makes the node ready; ``strict_readiness: false`` is
    ready throughout.  The failure is in the repository index either way."""
    root = tmp_path / "repo"
    (root / "ctr_ts" / "1").mkdir(parents=True)
    (root / "ctr_ts" / "config.yaml").write_text("workers: 1\nsla: {target_ms: 20}\n" + generous_yaml())
    (root / "ctr_ts" / "1" / "model.pt").write_bytes(b"not a torchscript archive")
    with started(NodeConfig(models=[], repository=str(root), strict_readiness=strict)) as server:
        over_http, over_grpc = http.triton(server.ports.http), grpc_client.triton(server.ports.grpc)
        assert over_http.is_server_live()
        assert over_http.is_server_ready() is not strict and over_grpc.is_server_ready() is not strict
        assert health(server.ports.grpc) == ("NOT_SERVING" if strict else "SERVING")
        assert http.get(server.ports.http, "/v2/health/ready").status == (503 if strict else 200)
        index = http.post_json(server.ports.http, "/v2/repository/index", timeout_s=60).json()
        assert [(e["name"], e["state"]) for e in index] == [("ctr_ts", "UNAVAILABLE")]
        assert "cannot read the program" in index[0]["reason"]
        answer = http.post_json(server.ports.http, "/v2/models/ctr_ts/infer", {"inputs": []}, timeout_s=60)
        assert answer.status == 404 and "model 'ctr_ts' failed to load: " in answer.json()["error"]
        assert "cannot read the program" in answer.json()["error"]
        for mistyped in ("ctr", "..", "ctr_ts/.."):  # a name the repository does not hold changes nothing
            with pytest.raises(InferenceServerException, match="no model"):
                over_grpc.load_model(mistyped)  # in the message: no URL path to normalise
        assert over_http.is_server_ready() is not strict and "ctr_ts" in server.core.loader.failed()
        over_http.unload_model("ctr_ts")  # no longer wanted
        assert over_http.is_server_ready()
        answer = http.post_json(server.ports.http, "/v2/models/ctr_ts/infer", {"inputs": []}, timeout_s=60)
        assert answer.status == 404 and "model 'ctr_ts' is not loaded (unloaded)" in answer.json()["error"]
        with pytest.raises(InferenceServerException, match="no model 'ctr'"):
            over_http.load_model("ctr")
        assert over_http.is_server_ready()
        shutil.rmtree(root / "ctr_ts" / "1")
        write_version(trained(0, "ctr_ts"), root / "ctr_ts", 1, "torchscript")
        (root / "ctr_ts" / "2").mkdir()
        (root / "ctr_ts" / "2" / "model.pt").write_bytes(b"not a torchscript archive either")
        with pytest.raises(InferenceServerException, match="version 2 not loaded"):
            over_http.load_model("ctr_ts")  # every version the policy selects, or none
        assert over_http.is_server_ready() is not strict
        shutil.rmtree(root / "ctr_ts" / "2")
        over_http.load_model("ctr_ts")
        assert over_http.is_server_ready() and over_grpc.is_server_ready()
        assert health(server.ports.grpc) == health(server.ports.grpc, "inference.GRPCInferenceService") == "SERVING"
        over_grpc.close()


def health(port: int, service: str = "", method: str = "Check") -> str:
    """The standard gRPC health check's answer for ``service`` (what a Kubernetes gRPC probe asks), in the wire
    bytes of grpc/health/v1/health.proto: ``HealthCheckRequest.service`` is field 1 (a string),
    ``HealthCheckResponse.status`` field 1 (a varint: 1 SERVING, 2 NOT_SERVING)."""
    request = b"\x0a" + bytes([len(service)]) + service.encode() if service else b""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(f"/grpc.health.v1.Health/{method}", request_serializer=None,
                                   response_deserializer=None)
        answer = call(request, timeout=30)
    return {b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}.get(answer, repr(answer))


def test_the_grpc_health_check_names_unknown_services_and_watch_is_not_served(node):
    _, ports = node
    assert health(ports.grpc) == health(ports.grpc, "inference.GRPCInferenceService") == "SERVING"
    with pytest.raises(grpc.RpcError) as unknown:
        health(ports.grpc, "ctr")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND and "unknown service 'ctr'" in unknown.value.details()
    with pytest.raises(grpc.RpcError) as watch:
        health(ports.grpc, method="Watch")
    assert watch.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with grpc.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as malformed:
            check(b"\xff\xff", timeout=30)
    assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT, malformed.value.details()


def test_calls_the_workers_forward_take_metadata_up_to_the_public_ports_limit(node):
    """A call the server process answers crosses a private hop: grpc-core's own 8 KiB metadata limit there must not
    refuse what the public port (16 KiB) accepted."""
    _, ports = node
    with grpc.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive", request_serializer=None,
                                   response_deserializer=None)
        for size in (9_000, 12_000, 15_000) * 4:
            assert live(b"", metadata=[("x-big", "a" * size)], timeout=30) == b"\x08\x01"  # live: true


def _body(batch) -> tuple[bytes, dict[str, str]]:
    arrays = batch.as_arrays()
    head = json.dumps({"inputs": [{"name": n, "datatype": DTYPE_NAMES[a.dtype], "shape": list(a.shape),
                                   "parameters": {"binary_data_size": a.nbytes}} for n, a in arrays.items()],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(a.tobytes() for a in arrays.values()), {"Inference-Header-Content-Length": str(len(head))}


async def _poisson_load(port: int, batches: list, rate: float, seconds: float, swap_at: float, swap) -> list[dict]:
    """Queries at Poisson arrivals over keep-alive connections; ``swap`` runs at ``swap_at`` s in a thread."""
    rng = np.random.default_rng(0)
    records: list[dict] = []
    start = time.perf_counter()

    async def one(session: aiohttp.ClientSession, i: int, sent: float) -> None:
        body, headers = _body(batches[i % len(batches)])
        record = {"i": i, "sent": sent, "status": None, "version": None, "scores": None}
        records.append(record)
        try:
            async with session.post(f"http://127.0.0.1:{port}/v2/models/swap/infer", data=body,
                                    headers=headers) as r:
                raw = await r.read()
                record["status"] = r.status
                if r.status == 200:
                    n = int(r.headers["Inference-Header-Content-Length"])
                    head = json.loads(raw[:n])
                    record["version"] = head["model_version"]
                    record["scores"] = np.frombuffer(raw[n:], dtype=np.float32).reshape(head["outputs"][0]["shape"])
        except aiohttp.ClientError as exc:
            record["status"] = f"{type(exc).__name__}: {exc}"

    loop = asyncio.get_running_loop()
    swapper = None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as session:
        tasks, t, i = [], 0.0, 0
        while t < seconds:
            t += rng.exponential(1 / rate)
            await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
            if swapper is None and t >= swap_at:
                swapper = loop.run_in_executor(None, swap)
            tasks.append(asyncio.ensure_future(one(session, i, time.perf_counter() - start)))
            i += 1
        await asyncio.gather(*tasks)
        await swapper
    return records


def test_new_version_swaps_in_under_poisson_load_with_no_failed_query(node, repo):
    _, ports = node
    old, new = trained(1, "swap"), trained(2, "swap")
    batches = [sample_batch(old, 1 + 3 * k, rng=k) for k in range(4)]
    write_version(new, repo / "swap", 2, "safetensors")
    swap_times: dict[str, float] = {}

    def swap() -> None:
        swap_times["start"] = time.perf_counter()
        status, body = http.post_json(ports.http, "/v2/repository/models/swap/load", timeout_s=120).status_and_json()
        assert status == 200, body
        swap_times["end"] = time.perf_counter()

    grpc_answers: list[str] = []
    stop = threading.Event()

    def grpc_queries() -> None:  # a gRPC client querying throughout, on its own connection
        client = grpc_client.triton(ports.grpc)
        while not stop.is_set():
            try:
                answer = client.infer("swap", grpc_inputs(batches[0]), client_timeout=30)
                ok = np.abs(answer.as_numpy("scores") - scores(old if answer.get_response().model_version == "1"
                                                               else new, batches[0])).max() <= 1e-6
                grpc_answers.append(answer.get_response().model_version if ok else "wrong scores")
            except Exception as exc:  # noqa: BLE001 - recorded, asserted below
                grpc_answers.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.02)

    querier = threading.Thread(target=grpc_queries)
    querier.start()
    try:
        records = asyncio.run(_poisson_load(ports.http, batches, rate=60.0, seconds=8.0, swap_at=2.0, swap=swap))
    finally:
        stop.set()
        querier.join()
    grpc_timeline = "".join(a if a in ("1", "2") else "x" for a in grpc_answers)
    print(f"gRPC: {len(grpc_answers)} queries, versions in order:\n{grpc_timeline}")
    assert all(a in ("1", "2") for a in grpc_answers), [a for a in grpc_answers if a not in ("1", "2")][:3]
    assert grpc_timeline.startswith("1") and grpc_timeline.endswith("2") and "21" not in grpc_timeline
    failed = [r for r in records if r["status"] != 200]
    timeline = "".join(r["version"] or "x" for r in sorted(records, key=lambda r: r["sent"]))
    print(f"{len(records)} queries, {len(failed)} failed; version per query in send order:\n{timeline}")
    assert not failed and len(records) > 100
    assert timeline.startswith("1" * 20) and timeline.endswith("2" * 20)
    assert set(timeline) == {"1", "2"}
    for r in records:  # every answer is its version's trained model's
        reference = old if r["version"] == "1" else new
        assert np.abs(r["scores"] - scores(reference, batches[r["i"] % len(batches)])).max() <= 1e-6
    _, index = http.post_json(ports.http, "/v2/repository/index", timeout_s=120).status_and_json()
    states = {(e["name"], e["version"]): e["state"] for e in index}
    assert states[("swap", "2")] == "READY" and states[("swap", "1")] == "UNAVAILABLE"
    answer = grpc_client.triton(ports.grpc).infer("swap", grpc_inputs(batches[1]))
    assert answer.get_response().model_version == "2"
    assert np.abs(answer.as_numpy("scores") - scores(new, batches[1])).max() <= 1e-6


def test_control_state_names_version_and_artifact(node):
    _, ports = node
    state = http.get_json(ports.http, "/control/models/ctr")
    assert state["artifact"].endswith("model.safetensors") and state["version"] == "1"
    assert state["stages"]["model"]["worker_detail"][0]["pss_mb"] > 0


def test_models_cli_lists_loads_and_unloads_on_a_server(node, capsys):
    from recserve.cli import main

    _, ports = node
    url = f"http://127.0.0.1:{ports.http}"
    assert main(["models", "unload", "ctr_pt2", "--server", url]) == 0
    assert main(["models", "list", "--server", url]) == 0
    out = capsys.readouterr().out
    assert "unloaded ctr_pt2" in out
    assert any(line.split()[:3] == ["ctr_pt2", "1", "UNAVAILABLE"] for line in out.splitlines())
    assert main(["models", "load", "ctr_pt2", "--server", url]) == 0
    assert "loaded ctr_pt2: version(s) 1 serving" in capsys.readouterr().out
    assert main(["models", "load", "nope", "--server", url]) == 2
    assert "no model 'nope'" in capsys.readouterr().err
    assert main(["models", "list"]) == 0  # the catalogue listing is unchanged
    assert "hera-dlrm-a" in capsys.readouterr().out


# ---------------------------------------------------------------- profile and plan a repository model


def test_a_repository_model_path_resolves_as_a_model_name(repo):
    from recserve.serving.node.config import served_name
    from recserve.specs import get_model

    for name in KINDS:
        spec = get_model(str(repo / name))
        assert spec.name == str(repo / name) and [t.rows for t in spec.tables] == [500, 500, 500]
        assert spec.sla.target_ms == 20  # config.yaml's
    assert get_model(str(repo / "swap" / "1")).sla.target_ms == 50  # config.yaml gives none: the spec's own
    assert served_name(str(repo / "ctr")) == "ctr" and served_name(str(repo / "ctr" / "1")) == "ctr"
    with pytest.raises(SpecError, match="repository model's path"):
        get_model("no-such-model")


def test_a_repository_path_builds_and_serves_its_own_artifact(repo):
    """What profiling measures for a repository model: the artifact itself, not a random zoo model at a scale."""
    from recserve.serving.node.config import ModelConfig
    from recserve.specs import get_model
    from recserve.zoo import build_or_load

    for name in ("ctr", "own"):
        path = str(repo / name)
        model = build_or_load(get_model(path), scale=1e-3)
        cfg = ModelConfig(model=path, scale=1e-3)
        assert (cfg.name, cfg.version, Path(cfg.artifact).parent) == (name, 1, repo / name / "1")
        assert cfg.served_rows() == tuple(t.rows for t in get_model(path).tables)  # real rows: scale does not apply
        batch = random_batch(cfg.spec.dense_in, cfg.served_rows(), (1,) * len(cfg.served_rows()), 3, 0)
        want = scores(trained(0, name), batch) if name == "ctr" else \
            OwnArchitecture()(batch.dense, batch.values, batch.lengths).detach().numpy()
        assert np.abs(scores(model, batch) - want).max() <= 1e-6


def test_bench_sends_a_repository_model_ids_over_its_whole_tables(repo, capsys):
    """A repository model is served as its files hold it, so bench's queries span its real rows (scale 1)."""
    from recserve.cli import main

    assert main(["bench", "--model", str(repo / "ctr"), "--target", "inprocess:thread", "--rate", "20",
                 "--duration", "0.5"]) == 0
    assert f"model {repo / 'ctr'} at scale 1," in capsys.readouterr().err


def test_plan_and_perfmodel_take_a_repository_model(repo, tmp_path, capsys):
    from recserve.cli import main

    model = str(repo / "ctr_pt2")
    assert main(["plan", "tier", "--model", model, "--dram-gb", "0.0001", "--qps", "1000"]) == 0
    assert "feasible" in capsys.readouterr().out
    assert main(["plan", "shard", "--model", model, "--qps", "1000"]) == 0
    assert f"{model}: target 1000 QPS" in capsys.readouterr().out
    out = tmp_path / "modelled.json"
    assert main(["profile", "model", "--models", model, "--servers", "hera-xeon", "--out", str(out)]) == 0
    tables = json.loads(out.read_text())["tables"]
    assert {t["model"] for t in tables} == {model}
    own = str(repo / "own")
    assert main(["profile", "model", "--models", own, "--servers", "hera-xeon", "--out", str(out)]) == 0
    assert main(["models", "show", own]) == 0
    assert '"flops_per_item": 640' in capsys.readouterr().out


def test_node_config_serves_a_repository_beside_catalogue_models_and_tiers_a_safetensors_model(repo, disk_dir):
    """``repository:`` in a node config; a repository model's ``tiering:`` goes through the SDM path."""
    from recserve.serving import config_from_dict

    root = Path(disk_dir) / "repo"
    shutil.copytree(repo / "ctr", root / "tiered")
    (root / "tiered" / "config.yaml").write_text(
        f"workers: 1\ntiering: {{dir: {disk_dir}, tables: all, cache_mb: 1, engine: threads}}\n" + generous_yaml())
    config = config_from_dict({"models": [generous({"model": "hera-ncf", "name": "ncf", "scale": 1e-4})],
                               "repository": str(root)})
    with started(config) as server:
        ports = server.ports
        client = http.triton(ports.http)
        reference = trained(0, "ctr")
        batch = sample_batch(reference, 9, rng=4)
        served = client.infer("tiered", http_inputs(batch)).as_numpy("scores")
        assert client.is_model_ready("ncf")
        tier_io = http.get_json(ports.http, "/control/models/tiered")["tier_io"]
    assert np.abs(served - scores(reference, batch)).max() <= 1e-6
    assert len(tier_io) == 3 and {t["engine"] for t in tier_io} == {"threads"}


def test_a_node_with_no_model_loaded_answers_grpc_itself_on_the_public_port(tmp_path):
    """No worker accepts yet (an empty repository): the server covers the shared gRPC socket with its own HTTP/2
    server and forwards every call to its gRPC service, so health and errors still answer."""
    (tmp_path / "repo").mkdir()
    with started(NodeConfig(models=[], repository=str(tmp_path / "repo"))) as server:
        ports = server.ports
        client = grpc_client.triton(ports.grpc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                live = client.is_server_live()
                break
            except InferenceServerException:
                time.sleep(0.1)
        assert live and client.is_server_ready()
        assert not client.is_model_ready("absent")
        with pytest.raises(InferenceServerException, match="absent"):
            client.infer("absent", grpc_inputs(sample_batch(trained(0, "ctr"), 2, rng=0)))
        client.close()


def test_exit_on_error_stops_a_node_whose_model_failed_to_load(tmp_path):
    """``serve --exit-on-error`` (Triton's): a model that fails to load at start ends the command with status 2,
    naming the model and why, and leaves no process behind; the ports it took are free again."""
    import os
    import signal
    import subprocess
    import sys

    root = tmp_path / "repo"
    (root / "ctr_ts" / "1").mkdir(parents=True)
    (root / "ctr_ts" / "config.yaml").write_text("workers: 1\nsla: {target_ms: 20}\n" + generous_yaml())
    (root / "ctr_ts" / "1" / "model.pt").write_bytes(b"not a torchscript archive")
    proc = subprocess.Popen([sys.executable, "-m", "recserve.cli", "serve", "--repository", str(root),
                             "--exit-on-error", "--http-port", "0", "--grpc-port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, stderr[-2000:]
    assert "ctr_ts failed to load" in stderr and "cannot read the program" in stderr
    assert "exit_on_error" in stderr and "Traceback" not in stderr

    def group_left() -> bool:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    # a worker's exit is reaped by the kernel, not awaited by its parent: later than the command's on a busy host
    assert not until(group_left, lambda left: not left), "a process of the session it started is left"


@pytest.mark.integration  # starts a node with two versions of a model
@pytest.mark.timeout(300)
def _successes(stats: dict) -> dict[tuple[str, str], int]:
    return {(e["name"], e["version"]): int(e["inference_stats"]["success"].get("count", 0))
            for e in stats["model_stats"]}


def test_two_loaded_versions_report_their_policy_and_count_their_queries_apart(tmp_path):
    """Triton's statistics: all versions of all models, all versions of one model, or one version; ``/metrics``
    labels each version; a version's counts survive loading the model again."""
    root = tmp_path / "repo"
    (root / "ctr").mkdir(parents=True)
    (root / "ctr" / "config.yaml").write_text("workers: 1\nversion_policy: {all: {}}\n" + generous_yaml())
    for version in (1, 2):
        write_version(trained(0, "ctr"), root / "ctr", version, "safetensors")
    with started(NodeConfig(models=[], repository=str(root))) as server:
        port = server.ports.http
        config = http.get_json(port, "/v2/models/ctr/config")
        assert config["version_policy"] == {"all": {}}
        over_grpc, over_http = grpc_client.triton(server.ports.grpc), http.triton(port)
        assert over_grpc.get_model_config("ctr", as_json=True)["config"]["version_policy"] == {"all": {}}
        inputs = http_inputs(sample_batch(trained(0, "ctr"), 3, rng=4))
        for version in ("1", "1", "2", "2", "2", ""):  # "": the newest version answers
            over_http.infer("ctr", inputs, model_version=version)
        want = {("ctr", "1"): 2, ("ctr", "2"): 4}
        everything = until(lambda: http.get_json(port, "/v2/models/stats"), lambda s: _successes(s) == want)
        assert _successes(everything) == want
        assert _successes(http.get_json(port, "/v2/models/ctr/stats")) == want
        assert _successes(http.get_json(port, "/v2/models/ctr/versions/1/stats")) == {("ctr", "1"): 2}
        assert _successes(over_grpc.get_inference_statistics("ctr", as_json=True)) == want
        assert _successes(over_grpc.get_inference_statistics("ctr", "2", as_json=True)) == {("ctr", "2"): 4}
        assert http.get(port, "/v2/models/ctr/versions/9/stats").status == 404
        samples = scrape(port)
        assert [metric_value(samples, "recserve_request_success_total", model="ctr", version=v)
                for v in ("1", "2")] == [2, 4]
        assert [metric_value(samples, "nv_inference_request_success", model="ctr", version=v)  # as Triton names it
                for v in ("1", "2")] == [2, 4]
        assert metric_value(samples, "nv_inference_count", model="ctr", version="2") == 12  # 4 queries of 3 items
        over_http.load_model("ctr")  # both versions still selected: they keep serving and keep their counts
        assert _successes(http.get_json(port, "/v2/models/ctr/stats")) == want
        over_grpc.close()


@pytest.mark.integration  # starts a node whose repository model reads a table from an SSD-tier file
@pytest.mark.timeout(300)
def test_a_repository_models_broken_tier_file_is_named_and_rebuilt(tmp_path, disk_dir):
    import os

    import yaml

    from recserve.cli import main
    from recserve.embedding.tablefile import read_header

    root = tmp_path / "repo"
    (root / "ctr").mkdir(parents=True)
    (root / "ctr" / "config.yaml").write_text(f"workers: 1\ntiering: {{dir: {disk_dir}, tables: all, cache_mb: 1}}\n"
                                              + generous_yaml())
    write_version(trained(0, "ctr"), root / "ctr", 1, "safetensors")
    node = tmp_path / "node.yaml"
    node.write_text(yaml.safe_dump({"repository": str(root), "models": []}))
    assert main(["tier", "rebuild", "--config", str(node)]) == 0  # writes the files from the trained weights
    first = sorted(p for p in os.listdir(disk_dir) if p.endswith(".tbl"))[0]
    path = os.path.join(disk_dir, first)
    with open(path, "r+b") as f:
        f.seek(read_header(path).data_offset + 8)
        f.write(b"\xff\xff\xff\xff")
    with started(NodeConfig(models=[], repository=str(root), strict_readiness=False)) as server:
        index = http.post_json(server.ports.http, "/v2/repository/index", timeout_s=60).json()
        assert [(e["name"], e["state"]) for e in index] == [("ctr", "UNAVAILABLE")]
        assert "checksum mismatch" in index[0]["reason"] and "recserve tier rebuild" in index[0]["reason"]
        assert main(["tier", "rebuild", "--config", str(node), "--model", "ctr"]) == 0
        http.triton(server.ports.http).load_model("ctr")
        assert http.triton(server.ports.http).is_model_ready("ctr")


def test_a_query_for_a_model_still_loading_hears_503_and_one_never_loaded_404():
    from recserve.serving.node.model_loader import not_served

    loading = not_served("m", [], None, {("m", ""): ("LOADING", "")})
    assert (loading.code, loading.status.http) == ("unavailable", 503) and "is loading" in str(loading)
    assert not_served("m", [], None, {("m", "1"): ("LOADING", "")}).code == "unavailable"  # its check runs
    unloaded = not_served("m", [], None, {("m", "1"): ("UNAVAILABLE", "unloaded")})
    assert unloaded.code == "not_found" and "is not loaded (unloaded)" in str(unloaded)
    failed = not_served("m", [], "m/1/model.pt: bad", {("m", "1"): ("UNAVAILABLE", "m/1/model.pt: bad")})
    assert failed.code == "not_found" and "failed to load: m/1/model.pt: bad" in str(failed)
    assert "unknown model 'x'; served: ['m']" in str(not_served("x", ["m"], None, {}))
