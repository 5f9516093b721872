from __future__ import annotations

import dataclasses

import pytest
import yaml

from recserve.deploy.k8s import manifests, validate, write_manifests
from recserve.deploy.sharding import access_counts, even_layout
from recserve.specs import SLA, ModelSpec, TableSpec
from recserve.zoo import build, sample_batch

pytest.importorskip("kubernetes_validate")


@pytest.fixture(scope="module")
def layout():
    spec = ModelSpec(name="tiny_rm", family="dlrm", dense_in=8, bottom_mlp=(16,), top_mlp=(8, 1), interaction="dot",
                     tables=tuple(TableSpec(f"t{i}", 10_000, 16, pooling=4) for i in range(2)), sla=SLA(400.0))
    model = build(spec, scale=0.1)
    return even_layout(model, access_counts(model, [sample_batch(model, 8, rng=i) for i in range(4)]), 3, scale=0.1)


def test_manifests_validate_against_the_kubernetes_schema(layout, tmp_path):
    objects = manifests(layout, qps_max={"t0-s0": 40.0})
    kinds = [o["kind"] for o in objects]
    assert kinds.count("HorizontalPodAutoscaler") == 1 + len(layout.shard_names())
    assert validate(objects) == []
    again = list(yaml.safe_load_all(write_manifests(objects, tmp_path / "m.yaml").read_text()))
    assert again == objects


def test_a_model_variants_name_becomes_valid_object_names_and_labels(layout):
    # `recserve plan shard --model elasticrec-rm1@tables=2` (docs/elasticrec.md) names its model with '@' and '='
    spec = dataclasses.replace(layout.spec, name="tiny_rm@tables=2")
    objects = manifests(dataclasses.replace(layout, spec=spec))
    assert validate(objects) == []
    assert "tiny-rm-tables-2-dense" in {o["metadata"]["name"] for o in objects}


def test_hpa_targets_follow_elasticrec(layout):
    objects = {o["metadata"]["name"] + "/" + o["kind"]: o for o in manifests(layout, qps_max={"t0-s0": 40.0})}
    hot = objects["tiny-rm-t0-s0/HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]
    assert hot["metric"]["name"] == "recserve_shard_qps" and hot["target"]["averageValue"] == "40000m"
    dense = objects["tiny-rm-dense/HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]
    assert dense["target"]["averageValue"] == "260000m"  # 65% of a 400 ms SLA


def test_validation_catches_a_broken_object(layout):
    objects = manifests(layout)
    objects[0]["spec"]["replicas"] = "three"
    assert validate(objects[:1])


@pytest.mark.integration  # seconds of work
def test_deploy_k8s_cli_writes_valid_manifests(tmp_path):
    from recserve.cli import main

    out = tmp_path / "k8s.yaml"
    assert main(["deploy", "k8s", "--model", "elasticrec-rm1", "--qps", "3000", "--out", str(out)]) == 0
    objects = list(yaml.safe_load_all(out.read_text()))
    assert validate(objects) == []
    assert {o["kind"] for o in objects} == {"Deployment", "Service", "HorizontalPodAutoscaler"}


def test_names_labels_and_one_object_per_kind_and_name_are_validated(layout):
    service, deployment = (next(o for o in manifests(layout) if o["kind"] == kind) for kind in ("Service",
                                                                                                  "Deployment"))
    bad_name = {**service, "metadata": {**service["metadata"], "name": "1ctr"}}
    bad_label = {**deployment, "metadata": {**deployment["metadata"], "labels": {"recserve/serves-": "true"}}}
    errors = validate([service, service, bad_name, bad_label])
    assert any(e.startswith(f"Service/{service['metadata']['name']}: 2 objects") for e in errors)
    assert any(e.startswith("Service/'1ctr': not a valid name (DNS-1035") for e in errors)
    assert any("label recserve/serves-='true'" in e for e in errors)
    assert len(errors) == 3
