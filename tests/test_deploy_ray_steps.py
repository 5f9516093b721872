"""`recserve deploy ray` without Ray: the shard command's run log and a pool plan's load report, with Ray Serve, the
gather timing and the HTTP load replaced by fakes (what is pinned: which steps run, in which order, and what each
writes into the report)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from recserve.cli import main
from recserve.commands import deploy_ray
from recserve.deploy import ray_serve
from recserve.measure import loadgen
from recserve.measure.loadgen import LoadResult
from recserve.measure.requests import RequestPool
from recserve.profiles import ProfileTable
from recserve.specs import get_model
from recserve.zoo import build

pytest.importorskip("torch")


class FakeRay:
    """Ray Serve's calls the shard command makes, recorded; every shard runs its planned replicas."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.planned: dict[str, int] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(ray_serve, "start_ray", lambda address=None: self.calls.append(f"start {address}"))
        monkeypatch.setattr(ray_serve, "deploy", self.deploy)
        monkeypatch.setattr(ray_serve, "planned_replicas", self.planned_replicas)
        monkeypatch.setattr(ray_serve, "wait_replicas", lambda expected, *a, **k: dict(expected))
        monkeypatch.setattr(ray_serve, "replica_counts", lambda *a: dict(self.planned))
        monkeypatch.setattr(ray_serve, "shutdown", lambda: self.calls.append("shutdown"))

    def deploy(self, layout, **kwargs):
        self.calls.append(f"deploy autoscale={kwargs['autoscale']} max_replicas={kwargs['max_replicas']} "
                          f"qps_max={sorted(kwargs['qps_max'].items())}")

        async def remote(query):
            return None

        return SimpleNamespace(infer=SimpleNamespace(remote=remote))

    def planned_replicas(self, layout):
        self.planned = {name: 1 for name in layout.shard_names()}
        return dict(self.planned)


def test_shard_command_measures_deploys_checks_and_ramps_in_order(tmp_path, monkeypatch):
    fake = FakeRay()
    fake.install(monkeypatch)
    monkeypatch.setattr(deploy_ray, "_measure_qps_max", lambda weights, probes: {k: 10.0 for k in probes})
    monkeypatch.setattr(deploy_ray, "_shard_scores_diff", lambda handle, model, batch, sampler: 0.0)
    out = tmp_path / "shards.json"
    assert main(["deploy", "ray", "--model", "elasticrec-rm1", "--scale", "1e-4", "--max-tables", "2",
                 "--batch", "4", "--ramp", "40,80", "--step-s", "0.1", "--json", str(out)]) == 0
    log = json.loads(out.read_text())
    shards = ["emb0-s0", "emb0-s1", "emb1-s0", "emb1-s1"]
    assert fake.calls == ["start None", f"deploy autoscale=True max_replicas=4 qps_max="
                                        f"{sorted({s: 5.0 for s in shards}.items())}", "shutdown"]
    assert (log["model"], log["scale"]) == ("elasticrec-rm1", 1e-4)
    assert [s for s in log["shards"] if s != "dense"] == shards
    assert log["qps_max"] == {s: 5.0 for s in shards}  # the gather rate times --headroom 0.5
    assert log["replicas_after_deploy"] == log["planned_replicas"] and log["replicas_as_planned"]
    assert log["scores_max_abs_diff"] == 0.0
    assert [(s["rate"], s["errors"], s["replicas"]) for s in log["steps"]] == [
        (40.0, 0, log["planned_replicas"]), (80.0, 0, log["planned_replicas"])]
    rng = np.random.default_rng(0)  # --seed 0: the arrivals sent are the seeded generator's
    for step in log["steps"]:
        t, sent = 0.0, 0
        while t < 0.1:
            t += rng.exponential(1.0 / step["rate"])
            sent += 1
        assert step["sent"] == sent


class FakeSession:
    """A load session whose scores are the in-process model's and whose run appends the router's decisions."""

    def __init__(self, target, pool, model, log_path, sizes) -> None:
        self.pool, self.model, self.log_path, self.sizes = pool, model, log_path, sizes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def outputs(self, i):
        import torch

        with torch.inference_mode():
            return {"scores": self.model(self.pool.batch(i)).numpy()}

    def run(self, rate, seconds, timeout_s, seed):
        with open(self.log_path, "a") as f:
            for size in self.sizes:
                f.write(json.dumps({"event": "start", "type": "fast" if size < 100 else "slow", "size": int(size)})
                        + "\n")
        return LoadResult("fake", rate, seconds, seconds, 4, np.array([5.0, 6.0, 7.0, 9.0]), {})


def test_pool_load_report_holds_scores_measured_simulated_and_the_routers_decisions(tmp_path, monkeypatch):
    spec = get_model("kairos-wnd")
    args = SimpleNamespace(http_port=8000, scale=1e-4, seed=0, rate=20.0, seconds=1.0, policy="kairos")
    pool = RequestPool(spec, args.scale, (8, 200, 30), args.seed)
    sizes = np.asarray(pool.sizes)[loadgen.schedule(args.rate, args.seconds, None, len(pool.sizes), args.seed)[1]]
    model = build(spec, scale=args.scale, seed=args.seed).eval()
    log_path = tmp_path / "decisions.jsonl"
    log_path.write_text(json.dumps({"event": "pool", "instances": ["fast", "slow"]}) + "\n")
    monkeypatch.setattr(loadgen, "LoadSession",
                        lambda target, pool: FakeSession(target, pool, model, log_path, sizes))
    latency = ProfileTable(spec.name, "this-host", "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"),
                           [[8, 2.0, 2.0, 3.0], [30, 4.0, 4.0, 6.0], [200, 10.0, 10.0, 14.0]])
    drive = {"choice": SimpleNamespace(model=spec.name, config={"fast": 1, "slow": 1}), "spec": spec, "pool": pool,
             "latency": latency, "qos_ms": 50.0}
    out = deploy_ray._run_load(args, drive, {f"kairos-{spec.name}": "/kairos"}, str(log_path))
    assert out["model"] == spec.name and out["pool"] == {"fast": 1, "slow": 1}
    assert (out["qos_ms"], out["rate_qps"], out["seconds"], out["router_prior"]) == (50.0, 20.0, 1.0, False)
    assert out["scores_max_abs_diff"] == 0.0
    assert out["measured"]["sent"] == 4 and out["measured"]["ok"] == 4 and out["measured"]["p50_ms"] == 6.5
    assert out["measured"]["served_by_type"] == {"fast": int((sizes < 100).sum()), "slow": int((sizes >= 100).sum())}
    assert out["router_decisions"] == len(sizes) and out["router_sizes_match_sent"]
    assert out["router_pool"] == ["fast", "slow"]
    assert out["latency_table"] == latency.to_dict()
    assert set(out["simulated"]) >= {"p50_ms", "p99_ms", "served_by_type"}
    assert set(out["simulated_with_ray_overhead"]) >= {"p50_ms", "p99_ms", "served_by_type"}
