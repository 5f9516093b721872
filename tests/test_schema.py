"""The schemas of what users hand to recserve (recserve/schema.py): an unknown key anywhere is refused and a wrong
type is named by its field path, in one line ``where: field: message`` of the caller's exception type."""

from __future__ import annotations

import re

import pytest

from recserve.errors import RecserveError, SpecError
from recserve.planners.plan import Plan, ShardPlan, TableShards
from recserve.serving.node import control_api
from recserve.serving.node.config import ModelConfig, config_from_dict, flood_limits
from recserve.serving.node.repository import Repository, parse_policy
from recserve.serving.wire.errors import InferError

MODEL = {"model": "hercules-rmc1", "scale": 1e-4}


def one_line(error: pytest.ExceptionInfo, pattern: str) -> str:
    text = str(error.value)
    assert "\n" not in text and re.fullmatch(pattern, text), text
    return text


@pytest.mark.parametrize(("config", "pattern"), [
    ({"hots": "x", "models": [MODEL]}, r"node\.yaml: hots: unknown field \(did you mean 'host'\?\); allowed: .*"),
    ({"models": [{**MODEL, "wokers": 2}]}, r"node\.yaml: models\[0\]\.wokers: unknown field \(did you mean "
                                           r"'workers'\?\); allowed: \[.*'workers'\]"),
    ({"models": [MODEL, {**MODEL, "name": "b", "accelerator": {"device": "cpu", "gpus": 1}}]},
     r"node\.yaml: models\[1\]\.accelerator\.gpus: unknown field; allowed: \[.*'workers'\]"),
    ({"grpc_limits": {"pingz": [1, 1]}, "models": [MODEL]},
     r"node\.yaml: grpc_limits\.pingz: unknown field \(did you mean 'pings'\?\); allowed: .*"),
])
def test_an_unknown_key_anywhere_in_a_node_config_is_named(config, pattern):
    with pytest.raises(SpecError) as error:
        config_from_dict(config, "node.yaml")
    one_line(error, pattern)


@pytest.mark.parametrize(("config", "pattern"), [
    ({"models": [{**MODEL, "workers": "2"}]}, r"node\.yaml: models\[0\]\.workers: must be an integer, got '2'"),
    ({"models": [{**MODEL, "threads": True}]}, r"node\.yaml: models\[0\]\.threads: must be an integer, got True"),
    ({"models": [{**MODEL, "accelerator": {"device": "cpu", "min_items": 0}}]},
     r"node\.yaml: models\[0\]\.accelerator\.min_items: must be >= 1, got 0"),
    ({"models": [{**MODEL, "accelerator": {"device": "tpu"}}]},
     r"node\.yaml: models\[0\]\.accelerator\.device: must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    ({"grpc_limits": {"pings": [5, "2"]}, "models": [MODEL]},
     r"node\.yaml: grpc_limits\.pings\[1\]: must be a number, got '2'"),
    ({"read_timeout_s": float("nan"), "models": [MODEL]},
     r"node\.yaml: read_timeout_s: must be a finite number, got nan"),
    ({"models": {"hercules-rmc1": {"scale": 1e-4, "mode": "split"}}},
     r"node\.yaml: models\[0\]\.mode: must be 'model' or 'pipeline', got 'split'"),
    (["models"], r"node\.yaml: must be a mapping, got \['models'\]"),
])
def test_a_wrong_type_in_a_node_config_names_its_field_path(config, pattern):
    with pytest.raises(SpecError) as error:
        config_from_dict(config, "node.yaml")
    one_line(error, pattern)


def test_a_config_built_in_code_fails_the_same_way():
    with pytest.raises(SpecError) as error:
        ModelConfig(model="hercules-rmc1", name="r", workers=0)
    one_line(error, r"model 'r': workers: must be >= 1, got 0")
    with pytest.raises(SpecError) as error:
        flood_limits({"continuations": -1})
    one_line(error, r"node config: grpc_limits: continuations: must be >= 0, got -1")


def test_the_rules_across_fields_keep_their_messages():
    with pytest.raises(SpecError, match=r"^model 'hercules-rmc1': accelerator needs mode: model"):
        config_from_dict({"models": [{**MODEL, "mode": "pipeline", "accelerator": {"device": "cpu"}}]})
    with pytest.raises(SpecError, match=r"^node config: served model names must be unique, repeated: \['a'\]"):
        config_from_dict({"models": [{**MODEL, "name": "a"}, {**MODEL, "name": "a"}]})
    config = config_from_dict({"models": [{**MODEL, "cores": [0], "workers": 2}]})
    assert config.models[0].worker_cores() == [[0], [0]] and config.models[0].deadline_ms > 0


def test_repository_settings_refuse_unknown_keys_and_name_wrong_types(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    config = tmp_path / "m" / "config.yaml"
    for text, pattern in (
            ("workers: 1\nversion_policy: {latest: {num: 2}}\n",
             r".*/m/config\.yaml: version_policy\.latest\.num: unknown field \(did you mean 'num_versions'\?\).*"),
            ("accelerator: {device: cpu, staging: 1}\n", r".*config\.yaml: accelerator\.staging: unknown field .*"),
            ("max_query_size: big\n", r".*config\.yaml: max_query_size: must be an integer, got 'big'"),
            ("version_policy: {specific: {versions: [1, x]}}\n",
             r".*config\.yaml: version_policy\.specific\.versions\[1\]: must be an integer, got 'x'"),
            ("version_policy: {}\n", r".*config\.yaml: version_policy: must be one of \{latest: .*")):
        config.write_text(text)
        with pytest.raises(SpecError) as error:
            Repository(tmp_path).settings("m")
        one_line(error, pattern)
    config.write_text("max_query_size: 8\nversion_policy: {all: null}\n")
    settings = Repository(tmp_path).settings("m")
    assert settings.serving == {"max_batch_size": 8} and settings.policy.select([2, 1]) == [1, 2]
    assert parse_policy({"latest": {"num_versions": 2}}, "x").select([1, 2, 3]) == [2, 3]


@pytest.mark.parametrize(("call", "field", "pattern"), [
    (lambda: control_api.workers_request({"workers": 1, "cores": [0], "thread": 1}, ["model"]), "thread",
     r"thread: unknown field \(did you mean 'threads'\?\); allowed: "
     r"\['cores', 'replace', 'stage', 'threads', 'workers'\]"),
    (lambda: control_api.sub_batch_request({"sub_batch": 1, "k": 2}, 64), "k", r"k: unknown field; allowed: .*"),
    (lambda: control_api.accelerator_request({"min_items": 1.5}, 64), "min_items",
     r"min_items: must be an integer, got 1\.5"),
    (lambda: control_api.workers_request({"workers": 1, "cores": [[0], []]}, ["model"]), "cores", r"cores: .*"),
    (lambda: control_api.llc_request(["ways"]), "body", r"body: must be a mapping, got \['ways'\]"),
    (lambda: control_api.window_query({"seconds": "inf"}, 95.0), "seconds",
     r"seconds: must be a finite number, got 'inf'"),
])
def test_a_control_body_refuses_unknown_keys_and_names_the_field(call, field, pattern):
    with pytest.raises(InferError) as error:
        call()
    assert error.value.field == field and error.value.status.http == 400
    one_line(error, pattern)


def test_a_plan_file_is_read_back_and_checked(tmp_path):
    plan = ShardPlan(planner="elasticrec", model="m", tables=[TableShards("t", [0, 5, 10], [2, 1], [0.5, 0.5], 80.0)],
                     modelwise_memory_bytes=160.0)
    data = plan.to_dict()
    assert Plan.from_dict(data) == plan  # the derived memory_bytes and saving_vs_modelwise are not read back
    data["tables"][0]["replica"] = 1
    with pytest.raises(RecserveError) as error:
        Plan.from_dict(data, "p.json")
    one_line(error, r"p\.json: tables\[0\]\.replica: unknown field \(did you mean 'replicas'\?\); allowed: .*")
    data["tables"][0].pop("replica")
    data["tables"][0]["replicas"] = [2, "many"]
    with pytest.raises(RecserveError) as error:
        Plan.from_dict(data, "p.json")
    one_line(error, r"p\.json: tables\[0\]\.replicas\[1\]: must be an integer, got 'many'")
    with pytest.raises(RecserveError) as error:
        Plan.from_dict({**plan.to_dict(), "kind": "shards"}, "p.json")
    one_line(error, r"p\.json: kind: unknown plan kind 'shards'; known: \[.*'shard'.*\]")


def test_workers_running_more_threads_than_their_cores_are_named_with_the_threads_that_fit(monkeypatch):
    """Loaded, with a warning at start: threads beyond the cores only wait for each other."""
    from recserve.serving.node import config

    monkeypatch.setattr(config, "available_cores", lambda: [0, 1])
    fits = ModelConfig(model="hercules-rmc1", name="r", scale=1e-4, workers=2, threads=1)
    assert fits.oversubscribed() == ""
    many = ModelConfig(model="hercules-rmc1", name="r", scale=1e-4, workers=1, threads=64)
    assert many.oversubscribed() == ("model 'r': 1 model worker(s) x 64 threads run on 2 core(s); set threads to at "
                                     "most 2 (or give them more cores)")
    pinned = ModelConfig(model="hercules-rmc1", name="r", scale=1e-4, workers=2, threads=2, cores=[[0], [0]])
    assert "2 model worker(s) x 2 threads run on 1 core(s); set threads to at most 1" in pinned.oversubscribed()
