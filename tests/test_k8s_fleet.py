"""`recserve deploy k8s --plan fleet.json` (issue #49): manifests that validate strictly and carry the fleet plan's
counts, node pools and resources, with the node config `deploy local` gives the same server."""

from __future__ import annotations

import math

import pytest
import yaml

from recserve.cli import main
from recserve.deploy.k8s import validate
from recserve.deploy.k8s_fleet import HPA_TARGET_FRACTION, TIERS_DIR, FleetManifests, dram_bytes, planned_cores
from recserve.deploy.k8s_plans import INSTANCE_TYPE_LABEL, plan_manifests
from recserve.deploy.local_fleet import fleet_node_configs
from recserve.embedding.tiered import tier_file_bytes
from recserve.errors import RecserveError
from recserve.planners.fleet import FleetGroup, FleetPlan, plan_fleet
from recserve.planners.fleet_spec import parse_fleet
from recserve.planners.plan import Plan
from recserve.serving import config_from_dict
from recserve.specs import get_model, get_server

pytest.importorskip("kubernetes_validate")

SPEC = {"models": {"hercules-rmc1": {"trace": [1500, 6000, 4000, 900]}, "kairos-rm2": {"peak_qps": 150}},
        "owned": {"hercules-t2": 1}, "rentable": {"c5n.2xlarge": {"max": 20}, "hercules-t1": {"price": 0.6, "max": 6}},
        "budget": 10}


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> FleetPlan:
    """A fleet plan from a small spec, read back from its JSON as the command reads it."""
    plan = plan_fleet(parse_fleet(SPEC))
    return Plan.load(plan.save(tmp_path_factory.mktemp("fleet") / "fleet.json"))


def tiered_plan() -> FleetPlan:
    """An SSD-tiered model on a trace, a Hera pair, and an ElasticRec shard block (as `plan fleet` writes them)."""
    return FleetPlan(inputs={"models": {"sdm-m1": {"peak_qps": 420.0, "trace": [90.0, 420.0, 300.0]},
                                        "hercules-rmc1": {"peak_qps": 3000.0}, "kairos-rm2": {"peak_qps": 400.0}}},
                     groups=[
        FleetGroup("pair", "hercules-t2", 2, 2, {"hercules-rmc1": 1264.8, "kairos-rm2": 147.5},
                   {"hercules-rmc1": "dram", "kairos-rm2": "dram"}, "", "Hera pair",
                   {"hercules-rmc1": {"workers": 10, "threads": 1, "ways": 4},
                    "kairos-rm2": {"workers": 10, "threads": 1, "ways": 7}}),
        FleetGroup("single", "sdm-hw-ss", 3, 3, {"sdm-m1": 150.0}, {"sdm-m1": "ssd"}, "", "SDM tiering",
                   {"sdm-m1": {"workers": 20, "threads": 1}}),
        FleetGroup("shards", "hercules-t2", 1, 3, {"elasticrec-rm1": 900.0}, {"elasticrec-rm1": "dram"}, "", "shards",
                   {}),
    ])


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def node_config_of(objects: list[dict], deployment: dict) -> dict:
    """The node config the pod's container reads: its ``--config`` path in the mounted ConfigMap."""
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    path = container["args"][container["args"].index("--config") + 1]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    (cm,) = [c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"] == volume["configMap"]["name"]]
    return yaml.safe_load(cm["data"][path.removeprefix(mount["mountPath"] + "/")])


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_manifests_carry_the_plans_counts_pools_and_guaranteed_cores(planned):
    objects = plan_manifests(planned, name="fl")
    assert validate(objects) == []
    groups = [g for g in planned.groups if g.kind in ("single", "pair")]
    deployments = by_kind(objects, "Deployment")
    assert len(deployments) == len(groups) >= 2
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h["spec"] for h in by_kind(objects, "HorizontalPodAutoscaler")}
    counts = {d["metadata"]["name"]: d["spec"].get("replicas") or hpas[d["metadata"]["name"]]["maxReplicas"]
              for d in deployments}
    for g, d in zip(groups, deployments, strict=True):
        assert counts[d["metadata"]["name"]] >= g.count  # the plan's units at peak, or more (below)
        pod = d["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {INSTANCE_TYPE_LABEL: g.server}
        anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["topologyKey"] == "kubernetes.io/hostname"  # one planned server per node
        res = pod["containers"][0]["resources"]
        assert res["requests"] == res["limits"]  # Guaranteed QoS
        cpus = int(res["requests"]["cpu"])
        config = node_config_of(objects, d)
        assert cpus == sum(m["workers"] for m in config["models"])  # one exclusive core per worker
        assert cpus <= min(planned_cores(g), get_server(g.server).cores - 1)  # the kubelet keeps a core
        assert [m["model"] for m in config["models"]] == list(g.qps)
    services = by_kind(objects, "Service")
    assert sorted(s["metadata"]["name"] for s in services) == ["fl-hercules-rmc1", "fl-kairos-rm2"]
    for s in services:  # a model's Service reaches every group that serves it, and only those
        model = s["metadata"]["name"].removeprefix("fl-")
        pods = [d["spec"]["template"]["metadata"]["labels"] for d in deployments]
        assert [selects(s["spec"]["selector"], p) for p in pods] == [model in g.qps for g in groups]
    # an HPA where the trace lets a group shrink: hercules-rmc1's lowest step is 900 of its 6000 QPS peak
    floors = {d["metadata"]["name"]: math.ceil(counts[d["metadata"]["name"]] * 900 / 6000)
              for g, d in zip(groups, deployments, strict=True) if list(g.qps) == ["hercules-rmc1"]}
    assert {n: (h["minReplicas"], h["maxReplicas"]) for n, h in hpas.items()} == \
        {n: (f, counts[n]) for n, f in floors.items() if f < counts[n]}
    assert hpas  # the spec's trace makes at least one
    assert all("replicas" not in d["spec"] for d in deployments if d["metadata"]["name"] in hpas)  # the HPA's


def test_the_node_config_is_the_one_deploy_local_gives_that_server(planned):
    """With no core kept for the kubelet each pod's config is deploy local's on a host of the plan's cores, less
    what the container decides (core ids, address, ports); the node server accepts it as written."""
    objects = FleetManifests(planned, scale=1e-3, name="fl", reserved_cpus=0).build()
    total = sum(planned_cores(g) for g in planned.groups if g.kind in ("single", "pair"))
    local, _ = fleet_node_configs(planned, scale=1e-3, cores=list(range(total)))
    deployments = by_kind(objects, "Deployment")
    assert len(local) == len(deployments)
    for cfg, d in zip(local, deployments, strict=True):
        config = node_config_of(objects, d)
        assert config["models"] == [{k: v for k, v in m.items() if k != "cores"} for m in cfg["models"]]
        assert (config["host"], config["http_port"], config["grpc_port"]) == ("0.0.0.0", 8000, 8001)
        assert int(d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]) == \
            sum(m["workers"] for m in cfg["models"])
        config_from_dict(config, "k8s")


def test_probes_tolerate_a_loaded_node_and_a_slow_start(planned):
    container = by_kind(plan_manifests(planned), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["livenessProbe"]["timeoutSeconds"] >= 5 and container["livenessProbe"]["failureThreshold"] >= 3
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # ten minutes to build tables


def test_an_ssd_tiered_model_on_a_trace_gets_its_volume_and_an_hpa():
    fleet = FleetManifests(tiered_plan(), scale=0.01, name="fl")
    objects = fleet.build()
    assert validate(objects) == []
    pair, tiered = by_kind(objects, "Deployment")
    assert pair["spec"]["template"]["metadata"]["annotations"]["recserve/llc-ways"] == "hercules-rmc1=4,kairos-rm2=7"
    config = node_config_of(objects, tiered)
    tier = config["models"][0]["options"]["tier"]
    pod = tiered["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "tiers"]
    assert tier["dir"].startswith(mount["mountPath"] + "/") and mount["mountPath"] == TIERS_DIR
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tiers"]
    spec = get_model("sdm-m1")
    user = sum(r * t.row_bytes(spec.bytes_per_elem) for r, t in zip(spec.scaled_rows(0.01), spec.tables, strict=True)
               if t.side == "user")
    assert int(volume["emptyDir"]["sizeLimit"].removesuffix("Gi")) * 2**30 >= user
    assert pod["containers"][0]["resources"]["limits"]["ephemeral-storage"] == \
        pod["containers"][0]["resources"]["requests"]["ephemeral-storage"]
    (hpa,) = by_kind(objects, "HorizontalPodAutoscaler")  # the pair serves a model without a trace: no HPA
    assert hpa["spec"]["scaleTargetRef"]["name"] == tiered["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (math.ceil(3 * 90 / 420), 3)
    workers = config["models"][0]["workers"]
    target = hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"]
    assert target == f"{round(HPA_TARGET_FRACTION * 150.0 * workers / 20 * 1000)}m"
    assert any("shards on hercules-t2 (elasticrec-rm1): not in these manifests" in n for n in fleet.notes)
    assert any("19 of the plan's 20 cores" in n for n in fleet.notes)
    # 3 pods for sdm-m1's 420 QPS peak, each carrying 150 x 19/20: an even spread holds it, no warning
    assert not any(n.startswith("sdm-m1:") for n in fleet.notes)


def test_a_service_over_pods_of_unequal_capacity_says_it_spreads_evenly():
    plan = FleetPlan(inputs={"models": {"kairos-rm2": {"peak_qps": 400.0}}}, groups=[
        FleetGroup("single", "c5n.2xlarge", 1, 1, {"kairos-rm2": 65.0}, {"kairos-rm2": "dram"}, "", "",
                   {"kairos-rm2": {"workers": 7, "threads": 1}}),
        FleetGroup("single", "hercules-t2", 2, 2, {"kairos-rm2": 170.0}, {"kairos-rm2": "dram"}, "", "",
                   {"kairos-rm2": {"workers": 19, "threads": 1}})])
    fleet = FleetManifests(plan)
    fleet.build()
    (note,) = [n for n in fleet.notes if n.startswith("kairos-rm2:")]
    assert "evenly over 3 pods, 133.3 QPS each" in note and "65.0 QPS a c5n.2xlarge pod" in note


def test_cli_writes_one_file_per_kind_and_says_what(tmp_path, capsys):
    path = tiered_plan().save(tmp_path / "fleet.json")
    out = tmp_path / "k8s"
    out.mkdir()
    (out / "statefulset.yaml").write_text("left from an earlier plan")
    assert main(["deploy", "k8s", "--plan", str(path), "--out", str(out), "--scale", "0.01"]) == 0
    printed = capsys.readouterr()
    files = sorted(p.name for p in out.iterdir())
    assert files == ["configmap.yaml", "deployment.yaml", "horizontalpodautoscaler.yaml", "service.yaml"]
    assert all(str(out / f) in printed.out for f in files)
    objects = [o for f in files for o in yaml.safe_load_all((out / f).read_text())]
    assert validate(objects) == [] and "note: 1 x shards" in printed.err


@pytest.mark.parametrize("plan, message", [
    (Plan(planner="hercules"), "no Kubernetes deployment for 'plan' plans"),
    (FleetPlan(groups=[tiered_plan().groups[2]]), "no single-model or co-located server group"),
])
def test_a_plan_it_cannot_deploy_is_one_line(plan, message, tmp_path, capsys):
    path = plan.save(tmp_path / "p.json")
    assert main(["deploy", "k8s", "--plan", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def gpu_plan(mode: str = "model") -> FleetPlan:
    """hera-din on a g4dn.xlarge (a T4) as Hercules' search configures it there: device threads fusing queries."""
    alloc = {"workers": 4, "threads": 1, "batch": 512, "mode": mode, "sparse_workers": 4 if mode == "pipeline" else 0}
    return FleetPlan(inputs={"models": {"hera-din": {"peak_qps": 2000.0}}}, groups=[
        FleetGroup("single", "g4dn.xlarge", 1, 1, {"hera-din": 2831.9}, {"hera-din": "dram"},
                   "model-based: 4 threads x 1 cores, fused batch 512", "Hercules search", {"hera-din": alloc})])


def test_a_gpu_server_types_pods_request_the_gpu_and_configure_its_accelerator_workers():
    objects = FleetManifests(gpu_plan(), scale=0.01, name="fl").build()
    assert validate(objects) == []
    (deployment,) = by_kind(objects, "Deployment")
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1"
    (model,) = node_config_of(objects, deployment)["models"]
    assert model["accelerator"] == {"device": "cuda", "workers": model["workers"], "threads": 1, "min_items": 1,
                                    "fuse_items": 512}  # every query to the device, fused as the plan assumed
    model["accelerator"]["device"] = "cpu"  # this host has no GPU: the rest of the config as the node reads it
    config_from_dict({"models": [model]}, "k8s")


def test_deploy_local_configures_the_accelerator_on_the_planned_cores():
    (config,), _ = fleet_node_configs(gpu_plan(), scale=0.01, cores=[0, 1, 2, 3])
    (model,) = config["models"]
    assert model["accelerator"]["cores"] == model["cores"] == [[0], [1], [2], [3]]
    assert (model["accelerator"]["workers"], model["accelerator"]["fuse_items"]) == (4, 512)


def test_a_cpu_server_types_pods_request_no_gpu(planned):
    objects = plan_manifests(planned)
    for d in by_kind(objects, "Deployment"):
        assert "nvidia.com/gpu" not in d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert all("accelerator" not in m for m in node_config_of(objects, d)["models"])


def test_a_pipeline_with_dense_threads_on_the_gpu_is_refused_naming_its_group(tmp_path, capsys):
    path = gpu_plan("pipeline").save(tmp_path / "gpu.json")
    assert main(["deploy", "k8s", "--plan", str(path), "--out", str(tmp_path / "out")]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "single group on g4dn.xlarge (hera-din)" in err and "pipeline dense threads on the T4" in err


def one_group_each(*models: str) -> FleetPlan:
    return FleetPlan(groups=[FleetGroup("single", "hercules-t2", 1, 1, {m: 100.0}, {m: "dram"}, "", "",
                                        {m: {"workers": 2, "threads": 1}}) for m in models])


def test_names_that_sanitise_alike_stay_distinct_and_valid():
    models = ["Ctr_Model", "ctr-model", "ctr.model", "ctr model", "模型", "1ctr", "b" * 71, "b" * 70 + "c"]
    objects = FleetManifests(one_group_each(*models), name="fl").build()
    assert validate(objects) == []  # names, labels, and one object per kind and name
    services = [s["metadata"]["name"] for s in by_kind(objects, "Service")]
    assert len(set(services)) == len(models) and "fl-ctr-model" in services  # a valid name is kept as it is
    for s in by_kind(objects, "Service"):  # each Service selects its own model's pods only
        pods = [d for d in by_kind(objects, "Deployment")
                if selects(s["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
        assert len(pods) == 1


def test_a_long_name_prefix_keeps_the_groups_apart(planned):
    objects = FleetManifests(planned, name="x" * 61).build()
    assert validate(objects) == []
    names = [d["metadata"]["name"] for d in by_kind(objects, "Deployment")]
    assert len(set(names)) == len(names) >= 2 and all(len(n) <= 63 for n in names)


def test_two_models_served_under_one_name_are_refused_naming_both():
    with pytest.raises(RecserveError, match="models 'repo/a/ctr' and 'repo/b/ctr' both become Service 'fl-ctr'"):
        FleetManifests(one_group_each("repo/a/ctr", "repo/b/ctr"), name="fl").build()


@pytest.mark.parametrize("prefix", ["---", "1fleet"])
def test_a_name_prefix_no_service_name_can_start_with_is_refused(prefix, tmp_path, capsys):
    path = one_group_each("ctr").save(tmp_path / "p.json")
    assert main(["deploy", "k8s", "--plan", str(path), f"--name={prefix}", "--out", str(tmp_path / "out")]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "--name" in err and "must start with a letter" in err


def test_the_tier_volume_holds_the_files_the_node_writes():
    """Sized by the files as written (fp32 rows padded to their stride, each file's header and footer), not by the
    catalogue's bytes per element: sdm-m1 at 0.3 writes ~111 GiB of user tables, 1 byte a value would be 27."""
    objects = FleetManifests(tiered_plan(), scale=0.3, name="fl").build()
    tiered = by_kind(objects, "Deployment")[1]
    tier = node_config_of(objects, tiered)["models"][0]["options"]["tier"]
    pod = tiered["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tiers"]
    spec = get_model("sdm-m1")
    written = tier_file_bytes(spec.tables, spec.scaled_rows(0.3), tier)
    assert written > sum(r * t.dim * 4 for r, t in zip(spec.scaled_rows(0.3), spec.tables, strict=True)
                         if t.side == "user")
    gib = int(volume["emptyDir"]["sizeLimit"].removesuffix("Gi"))
    assert written <= gib * 2**30 <= written * 1.1 + 2**30
    assert pod["containers"][0]["resources"]["limits"]["ephemeral-storage"] == f"{gib + 1}Gi"


def test_a_group_whose_tables_cannot_fit_its_pods_memory_is_refused_naming_the_scale_that_fits(tmp_path, capsys):
    """Full-size sdm-m1 keeps its item tables in DRAM: 162 GiB at the node's fp32 (40 at the catalogue's 1 byte a
    value) on a 64 GB sdm-hw-ss: every pod would be killed at start."""
    path = tiered_plan().save(tmp_path / "p.json")
    assert main(["deploy", "k8s", "--plan", str(path), "--out", str(tmp_path / "out")]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "sdm-m1" in err and "166.5 GiB of embedding tables in DRAM" in err and "57.6 GiB" in err
    scale = float(err.split("--scale ")[1].split()[0])
    assert scale == 0.34  # 57.6 / 166.5 rounded down
    FleetManifests(tiered_plan(), scale=scale, name="fl").build()  # the scale it names fits


def test_dram_bytes_counts_the_tables_off_the_tier_at_fp32_and_the_tiers_caches():
    spec = get_model("sdm-m1")
    rows = spec.scaled_rows(0.01)
    item = sum(r * t.dim * 4 for r, t in zip(rows, spec.tables, strict=True) if t.side == "item")
    model = {"model": "sdm-m1", "scale": 0.01}
    assert dram_bytes({"models": [model]}) == sum(r * t.dim * 4 for r, t in zip(rows, spec.tables, strict=True))
    tier = {"dir": "/x", "tables": "user", "cache_mb": 100, "pooled_cache_mb": 28}
    assert dram_bytes({"models": [{**model, "options": {"tier": tier}}]}) == item + 128 * 2**20
    assert dram_bytes({"models": [{"model": "/models/own", "scale": 1.0}]}) == 0  # a repository model: its file's


def test_tier_file_bytes_is_what_the_node_writes(tmp_path):
    from recserve.embedding.tiered import tier_from_config
    from recserve.zoo import build

    spec = get_model("sdm-m1")
    tier = {"dir": str(tmp_path), "tables": "user"}
    tier_from_config(build(spec, scale=1e-4), dict(tier))
    assert sum(f.stat().st_size for f in tmp_path.iterdir()) == tier_file_bytes(spec.tables, spec.scaled_rows(1e-4),
                                                                                 tier)


def test_pods_are_added_where_the_kubelets_core_leaves_a_model_short_of_its_peak():
    """kairos-rm2's 400 QPS peak on 2 + 1 servers planned on all their 20 and 8 cores: the 19 and 7 left per pod
    carry 2 x 161.5 + 56.9 = 379.9 QPS."""
    plan = FleetPlan(inputs={"models": {"kairos-rm2": {"peak_qps": 400.0}}}, groups=[
        FleetGroup("single", "hercules-t2", 2, 2, {"kairos-rm2": 170.0}, {"kairos-rm2": "dram"}, "", "",
                   {"kairos-rm2": {"workers": 20, "threads": 1}}),
        FleetGroup("single", "c5n.2xlarge", 1, 1, {"kairos-rm2": 65.0}, {"kairos-rm2": "dram"}, "", "",
                   {"kairos-rm2": {"workers": 8, "threads": 1}})])
    fleet = FleetManifests(plan, name="fl")
    big, small = by_kind(fleet.build(), "Deployment")
    assert (big["spec"]["replicas"], small["spec"]["replicas"]) == (3, 1)  # one more where a pod carries most
    assert 3 * 170.0 * 19 / 20 + 65.0 * 7 / 8 >= 400.0
    assert any(n.startswith("fl-g0-single-hercules-t2: 3 pods for the plan's 2") and "kairos-rm2" in n
               for n in fleet.notes)


def test_too_few_cores_left_by_the_kubelet_names_the_flag():
    plan = tiered_plan()
    with pytest.raises(RecserveError, match=r"hercules-t2: 0 allocatable cores \(20 less --reserved-cpus 20\) "
                                            r"cannot run 2 models"):
        FleetManifests(plan, reserved_cpus=20).build()
