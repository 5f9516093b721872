"""Every plan kind becomes Kubernetes manifests that validate strictly and carry the planned quantities."""

from __future__ import annotations

import pytest
import yaml

from recserve.deploy.k8s import validate
from recserve.deploy.k8s_plans import INSTANCE_TYPE_LABEL, cron_schedule, plan_manifests
from recserve.planners.plan import (
    ColocationPlan,
    Placement,
    Plan,
    PoolChoice,
    PoolPlan,
    ProvisionPlan,
    ProvisionStep,
    ServerPlan,
    ShardPlan,
    TableShards,
)
from recserve.policies.router import load_pool
from recserve.specs import get_model

pytest.importorskip("kubernetes_validate")


def reloaded(plan: Plan, tmp_path) -> Plan:
    """Deploy from the JSON artifact, as ``recserve deploy k8s --plan`` does."""
    return Plan.load(plan.save(tmp_path / f"{plan.kind}.json"))


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container(obj: dict) -> dict:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] != "CronJob" else \
        obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return spec["containers"][0]


def test_hera_colocation_gives_guaranteed_pods_with_the_planned_cores(tmp_path):
    a = ServerPlan("hera-xeon", [Placement("hera-dlrm-a", 10, 7, 900.0, 1300.0), Placement("hera-ncf", 6, 4, 9e3, 2e4)])
    b = ServerPlan("hera-xeon", [Placement("hera-wnd", 16, 11, 1800.0, 1800.0)])
    plan = reloaded(ColocationPlan(planner="hera", servers=[a, a, b]), tmp_path)
    objects = plan_manifests(plan, name="hera")
    assert validate(objects) == []
    deployments = by_kind(objects, "Deployment")
    assert sorted(d["spec"]["replicas"] for d in deployments.values()) == [1, 2]  # two identical servers share one
    for d in deployments.values():
        res = container(d)["resources"]
        assert res["requests"] == res["limits"]  # Guaranteed QoS
        assert res["requests"]["cpu"] == "16"  # integer: exclusive cores under the static CPU manager
        assert d["spec"]["template"]["spec"]["nodeSelector"] == {INSTANCE_TYPE_LABEL: "hera-xeon"}
    two = next(d for d in deployments.values() if d["spec"]["replicas"] == 2)
    config = yaml.safe_load(by_kind(objects, "ConfigMap")[two["metadata"]["name"]]["data"]["node.yaml"])
    assert [(m["model"], m["workers"], m["threads"]) for m in config["models"]] == [("hera-dlrm-a", 10, 1),
                                                                                      ("hera-ncf", 6, 1)]
    assert two["spec"]["template"]["metadata"]["annotations"]["recserve/llc-ways"] == "hera-dlrm-a=7,hera-ncf=4"


def test_kairos_pool_gives_node_pools_per_instance_type_and_a_router(tmp_path):
    choice = PoolChoice("kairos-rm2", {"g4dn.xlarge": 1, "c5n.2xlarge": 0, "r5n.large": 3}, 0.973, 120.0,
                        details={"base_type": "g4dn.xlarge"})
    plan = reloaded(PoolPlan(planner="kairos", inputs={"qos_ms": {"kairos-rm2": 350.0}}, pools=[choice]), tmp_path)
    objects = plan_manifests(plan, name="kairos")
    assert validate(objects) == []
    sets = by_kind(objects, "StatefulSet")
    planned = {s["spec"]["template"]["spec"]["nodeSelector"][INSTANCE_TYPE_LABEL]: s["spec"]["replicas"]
               for s in sets.values()}
    assert planned == {"g4dn.xlarge": 1, "r5n.large": 3}
    gpu = next(s for s in sets.values() if "g4dn" in s["metadata"]["name"])
    assert container(gpu)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container(gpu)["resources"]["limits"]["cpu"] == "4"
    routers = [d for d in by_kind(objects, "Deployment").values()
               if d["metadata"]["labels"].get("recserve/role") == "router"]
    assert len(routers) == 1 and container(routers[0])["args"][:3] == ["route", "--pool", "/etc/recserve/pool.yaml"]
    pool = yaml.safe_load(by_kind(objects, "ConfigMap")[routers[0]["metadata"]["name"]]["data"]["pool.yaml"])
    assert pool["qos_ms"] == 350.0 and pool["policy"] == "kairos"
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    assert load_pool(tmp_path / "pool.yaml").deadline() == 700.0  # the file the router reads is one it accepts
    assert [(b["type"], b["base"]) for b in pool["backends"]] == [("g4dn.xlarge", True)] + [("r5n.large", False)] * 3
    assert pool["backends"][1]["url"] == "http://kairos-kairos-rm2-r5n-large-0.kairos-kairos-rm2-r5n-large." \
                                         "default.svc.cluster.local:8000"
    for s in sets.values():  # headless Service of the same name gives each instance its DNS name
        assert by_kind(objects, "Service")[s["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"


def test_hercules_provisioning_gives_a_daily_schedule_with_reactive_hpas(tmp_path):
    steps = [ProvisionStep(0.0, {"hercules-rmc1": 1500.0}, {"hercules-rmc1": {"hercules-t2": 1}}, 166.0, {}),
             ProvisionStep(8.0, {"hercules-rmc1": 3000.0}, {"hercules-rmc1": {"hercules-t1": 2, "hercules-t2": 1}},
                           380.0, {}),
             ProvisionStep(16.5, {"hercules-rmc1": 900.0}, {"hercules-rmc1": {"hercules-t1": 1}}, 107.0, {})]
    inputs = {"available": {"hercules-t1": 4, "hercules-t2": 3},
              "efficiency": {"hercules-rmc1": {"hercules-t1": {"qps": 1563.6, "power_w": 107.4},
                                               "hercules-t2": {"qps": 1775.8, "power_w": 166.0}}}}
    plan = reloaded(ProvisionPlan(planner="hercules", inputs=inputs, steps=steps), tmp_path)
    objects = plan_manifests(plan, name="herc")
    assert validate(objects) == []
    crons = by_kind(objects, "CronJob")
    assert [c["spec"]["schedule"] for c in crons.values()] == ["0 0 * * *", "0 8 * * *", "30 16 * * *"]
    script = container(crons["herc-step-1"])["command"][2]
    assert "deployment/herc-hercules-rmc1-hercules-t1 --current-replicas=0 --replicas=2" in script
    assert '"minReplicas":2' in script and '"minReplicas":1' in script
    assert "deployment/herc-hercules-rmc1-hercules-t2 --replicas=0" in container(crons["herc-step-2"])["command"][2]
    deployments = by_kind(objects, "Deployment")
    assert deployments["herc-hercules-rmc1-hercules-t1"]["spec"]["replicas"] == 0  # off in the first step
    assert deployments["herc-hercules-rmc1-hercules-t2"]["spec"]["replicas"] == 1
    hpa = by_kind(objects, "HorizontalPodAutoscaler")["herc-hercules-rmc1-hercules-t1"]["spec"]
    assert hpa["maxReplicas"] == 4 and hpa["metrics"][0]["pods"]["target"]["averageValue"] == "1563600m"
    assert cron_schedule(23.75) == "45 23 * * *"


def test_elasticrec_plan_deploys_its_shards_with_planned_replicas(tmp_path):
    spec = get_model("elasticrec-rm1")
    tables = [TableShards(t.name, [0, t.rows // 10, t.rows], [3, 1], [100.0, 10.0], 1.0, qps_max=[40.0, 400.0])
              for t in spec.tables]
    plan = reloaded(ShardPlan(model=spec.name, target_qps=1000.0, dense_replicas=2, tables=tables), tmp_path)
    objects = plan_manifests(plan)
    assert validate(objects) == []
    deployments = by_kind(objects, "Deployment")
    assert deployments["elasticrec-rm1-dense"]["spec"]["replicas"] == 2
    assert deployments["elasticrec-rm1-emb0-s0"]["spec"]["replicas"] == 3
    hot = by_kind(objects, "HorizontalPodAutoscaler")["elasticrec-rm1-emb0-s0"]["spec"]["metrics"][0]["pods"]
    assert hot["target"]["averageValue"] == "40000m"


def test_deploy_k8s_cli_takes_a_plan_file(tmp_path):
    from recserve.cli import main

    plan = ColocationPlan(planner="hera", servers=[ServerPlan("hera-xeon", [Placement("hera-ncf", 4, 2, 1.0, 2.0)])])
    out = tmp_path / "m.yaml"
    assert main(["deploy", "k8s", "--plan", str(plan.save(tmp_path / "p.json")), "--out", str(out)]) == 0
    objects = list(yaml.safe_load_all(out.read_text()))
    assert validate(objects) == [] and {o["kind"] for o in objects} == {"ConfigMap", "Deployment", "Service"}
    assert "&id" not in out.read_text()  # no YAML anchors


def test_sdm_tier_plan_places_its_sm_tables_on_a_volume(tmp_path):
    from recserve.planners.sdm import TablePlacement, TierPlan

    tables = [TablePlacement("user0", "user", "SM", 10**9, 0.1, True, 0.9, 100.0),
              TablePlacement("user1", "user", "SM", 10**9, 0.1, False, 0.0, 100.0),
              TablePlacement("item0", "item", "FM", 10**9, 0.1, False, 0.0, 0.0)]
    plan = reloaded(TierPlan(planner="sdm/sm-cache", inputs={"model": "sdm-m1", "dram_gb": 8.0},
                             summary={"cache_gb": 0.5, "sm_gb": 2.0}, tables=tables), tmp_path)
    objects = plan_manifests(plan, name="sdm")
    assert validate(objects) == []
    (sts,) = by_kind(objects, "StatefulSet").values()
    assert container(sts)["resources"]["limits"]["memory"] == "8192Mi"  # the planned DRAM budget
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "3Gi"
    config = yaml.safe_load(by_kind(objects, "ConfigMap")[sts["metadata"]["name"]]["data"]["node.yaml"])
    tier = config["models"][0]["options"]["tier"]
    assert tier["tables"] == ["user0", "user1"] and tier["no_cache"] == ["user1"] and tier["cache_mb"] == 512


def test_a_node_configs_tier_plan_becomes_a_placement_before_storage(tmp_path):
    from recserve.deploy.nodeconfig import resolve_tier_plans
    from recserve.embedding.tiered import tier_from_config
    from recserve.planners.sdm import TablePlacement, TierPlan
    from recserve.serving.node.config import config_from_dict

    plan = TierPlan(planner="sdm", tables=[TablePlacement("user0", "user", "SM", 1, 0.1, False, 0.0, 1.0)])
    path = plan.save(tmp_path / "tier.json")
    config = config_from_dict({"models": [{"model": "sdm-m1", "options": {"tier": {"dir": "/x", "plan": str(path)}}}]})
    resolve_tier_plans(config)
    assert config.models[0].options["tier"] == {"dir": "/x", "tables": ["user0"], "no_cache": ["user0"]}
    with pytest.raises(Exception, match="must be resolved"):
        tier_from_config(object(), {"dir": "/x", "plan": str(path)})
