"""The bundled catalogue and the `recserve models` command: loading, derived sizes, user errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recserve.cli import main
from recserve.commands.models import rough_dense_params
from recserve.errors import SpecError
from recserve.specs import catalogue_models, catalogue_servers, load_models, model_from_dict

PAPER_PREFIXES = ("hera-", "hercules-", "elasticrec-", "kairos-", "sdm-")


def test_catalogue_has_every_paper_and_positive_sizes():
    models = catalogue_models()
    for prefix in PAPER_PREFIXES:
        assert any(name.startswith(prefix) for name in models), prefix
    for name, spec in models.items():
        assert spec.sla.target_ms > 0 and 50 <= spec.sla.percentile < 100, name
        assert spec.source, f"{name} has no source"
        assert spec.embedding_bytes > 0 and spec.gather_bytes_per_item > 0, name
        assert all(t.rows > 0 and t.dim > 0 and t.pooling > 0 for t in spec.tables), name
        if spec.family in ("din", "dien"):
            assert spec.sequence_tables, f"{name}: DIN/DIEN need a behaviour-history sequence table"
        if spec.family == "ncf":
            assert {t.side for t in spec.tables} == {"user", "item"}, name


def test_repeat_expands_into_distinct_tables():
    spec = catalogue_models()["hera-dlrm-b"]
    assert len(spec.tables) == 40 and len({t.name for t in spec.tables}) == 40


def test_kairos_qos_matches_reference_data():
    import json

    from recserve.reference import reference_path

    ref = reference_path("kairos_aws_latency.json")
    data = json.loads(ref.read_text())
    models, servers = catalogue_models(), catalogue_servers()
    for short, qos in data["qos_p99_ms"].items():
        sla = models[f"kairos-{short}"].sla
        assert (sla.target_ms, sla.percentile) == (qos, 99)
    for server, price in data["prices_usd_per_hr"].items():
        assert servers[server].price_per_hr == price


def test_servers_have_provisioned_power_and_documented_assumptions():
    for name, server in catalogue_servers().items():
        if name == "this-host":
            continue
        assert server.power_w and server.power_w > 0, name
        assert server.source and server.assumptions, name


def test_rough_dense_params_matches_the_built_dlrm():
    import torch

    from recserve.zoo import build

    spec = catalogue_models()["hera-dlrm-a"]
    model = build(spec, scale=1e-6)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert rough_dense_params(spec) == weights


def test_models_list_prints_every_model(capsys):
    assert main(["models", "list", "--scale", "1e-3"]) == 0
    out = capsys.readouterr().out
    for name in catalogue_models():
        assert name in out


def test_models_show_derived_sizes(capsys):
    import json

    assert main(["models", "show", "elasticrec-rm1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["derived"]["embedding_gb_full"] == pytest.approx(10 * 20e6 * 32 * 4 / 1e9)
    assert data["derived"]["gather_bytes_per_item"] == 10 * 128 * 32 * 4


GOOD = """
models:
  tiny:
    family: dlrm
    dense_in: 4
    bottom_mlp: [8]
    top_mlp: [4, 1]
    interaction: dot
    tables: [{name: t, rows: 100, dim: 8, pooling: 2, repeat: 3}]
    sla: {target_ms: 10}
"""


def test_user_file_is_listed(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD)
    assert main(["models", "list", "--file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "hera-dlrm-a" not in out


BAD_INPUTS = {
    "unknown": (["models", "show", "no-such-model"], None, "unknown model 'no-such-model'"),
    "no-repo-dir": (["models", "show", "/nonexistent/repo/ctr"], None, "'/nonexistent/repo/ctr': no such directory"),
    "malformed": (["models", "list", "--file", "{path}"], "models: {tiny: [unclosed\n", "malformed YAML"),
    "negative": (["models", "list", "--file", "{path}"], GOOD.replace("rows: 100", "rows: -100"),
                 "rows must be a positive number"),
    "missing": (["models", "list", "--file", "{path}"], GOOD.replace("    sla: {target_ms: 10}\n", ""),
                "missing field(s) ['target_ms']"),
    "no-file": (["models", "list", "--file", "/nonexistent/models.yaml"], None, "no such file"),
    "bad-server": (["models", "servers", "--file", "{path}"], "servers: {s: {cores: 4, mem_gb: -1, mem_bw_gbs: 1}}",
                   "mem_gb must be a positive number"),
    "negative-sla": (["models", "list", "--file", "{path}"], GOOD.replace("target_ms: 10", "target_ms: -5"),
                     "model 'tiny' sla: target_ms must be a positive number, got -5"),
    "duplicate-key": (["models", "list", "--file", "{path}"], GOOD.replace("    sla: {target_ms: 10}\n",
                                                                         "    sla: {target_ms: 10}\n    dense_in: 8\n"),
                      "bad.yaml: line 11 malformed YAML: duplicate key 'dense_in'"),
    "not-utf8": (["models", "list", "--file", "{path}"], b"models: {caf\xe9: {}}\n", "bad.yaml: not UTF-8 text"),
    "directory": (["models", "list", "--file", "{dir}"], None, "is a directory, not a file"),
}


def _argv(case: str, tmp_path: Path) -> list[str]:
    argv, text, _ = BAD_INPUTS[case]
    path = tmp_path / "bad.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    return [a.replace("{path}", str(path)).replace("{dir}", str(tmp_path)) for a in argv]


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_in_process(case, tmp_path, capsys):
    assert main(_argv(case, tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("recserve: error:")
    assert BAD_INPUTS[case][2] in err


SUBPROCESS_CASES = ["unknown", "malformed", "negative"]


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
    """The subprocess cases' CLIs, all started at once (each is mostly interpreter start-up, so together they
    take about the time of one): case -> (returncode, stderr), read on first use."""
    procs: dict[str, subprocess.Popen] = {}
    done: dict[str, tuple[int, str]] = {}

    def result(case: str) -> tuple[int, str]:
        if case not in done:
            _, stderr = procs[case].communicate(timeout=120)
            done[case] = (procs[case].returncode, stderr)
        return done[case]

    try:
        for case in SUBPROCESS_CASES:
            procs[case] = subprocess.Popen([sys.executable, "-m", "recserve.cli",
                                            *_argv(case, tmp_path_factory.mktemp(case))],
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        yield result
    finally:
        for proc in procs.values():
            proc.kill()  # a no-op for those already reaped
            proc.communicate()


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
@pytest.mark.integration  # seconds of work
def test_bad_input_is_one_line_exit_2_subprocess(case, cli_results):
    returncode, stderr = cli_results(case)
    assert returncode == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and BAD_INPUTS[case][2] in lines[0], stderr
    assert "Traceback" not in stderr


def test_dot_interaction_dims_are_validated():
    data = {"family": "dlrm", "dense_in": 4, "bottom_mlp": [8], "interaction": "dot",
            "tables": [{"name": "t", "rows": 10, "dim": 16}], "sla": {"target_ms": 5}}
    with pytest.raises(SpecError, match="dot interaction"):
        model_from_dict("x", data)


def test_load_models_reads_a_bare_mapping(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text(GOOD.replace("models:\n", ""))
    assert list(load_models(path)) == ["tiny"]


def test_models_list_prints_na_for_a_family_the_zoo_cannot_build(tmp_path, capsys, monkeypatch):
    import recserve.zoo as zoo

    monkeypatch.setattr(zoo, "FAMILY_CLASSES", {k: v for k, v in zoo.FAMILY_CLASSES.items() if k != "dlrm"})
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD.replace("tiny:", "tiny-unbuilt:"))
    assert main(["models", "list", "--file", str(path)]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("tiny-unbuilt"))
    assert " n/a " in row


def test_a_json_file_with_a_key_given_twice_is_refused_naming_the_key(tmp_path):
    from recserve.jsonio import read_json

    path = tmp_path / "plan.json"
    path.write_text('{"kind": "fleet", "kind": "pool"}')
    with pytest.raises(SpecError, match=r"plan\.json: not valid JSON \(duplicate key 'kind'\)"):
        read_json(path, SpecError)
