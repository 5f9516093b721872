"""A FleetPlan on this host: one node server per planned server group, on partitioned cores.

Each group of identical servers (a Hercules-configured single model, a Hera pair, an SDM-tiered model) becomes one
node config with the plan's models, its worker counts scaled to this host's cores (every model keeps at least one
worker) and each worker pinned to a core, round robin; an SSD-tiered model gets a ``tier`` section (its user-side
tables in files under the deployment's directory, behind the row cache), a model on a server type with an
accelerator an ``accelerator`` section (``deploy.nodeconfig.accelerator_section``: the plan's fused device passes).
ElasticRec shard blocks are left out here (``recserve shards serve`` runs them).  The node server executes the
configs; it never reads the plan.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recserve import tethered
from recserve.deploy.nodeconfig import accelerator_section
from recserve.errors import RecserveError
from recserve.hostinfo import how_it_ended, log_tail
from recserve.planners.fleet import FleetPlan
from recserve.planners.plan import Plan
from recserve.specs import fleet_served_name, get_model, get_server

TIER_CACHE_MB = 64  # the least row cache an SSD-tiered model gets
RESTART_WINDOW_S = 600.0  # a node's restarts count against ``max_restarts`` for this long (as Kubernetes' back-off)


def load_fleet_plan(path: str | Path) -> FleetPlan:
    plan = Plan.load(path)
    if not isinstance(plan, FleetPlan):
        raise RecserveError(f"{path}: not a `recserve plan fleet` plan (a {plan.kind!r} plan)")
    return plan


served_name = fleet_served_name  # the one rule (specs.py), under the name deploy's modules use


def tier_cache_mb(model: str, server: str, scale: float) -> int:
    """The row cache of an SSD-tiered model: the one its plan assumed (SDM's DRAM share of the server, less the
    DRAM-resident tables), scaled as its tables are, and at least ``TIER_CACHE_MB``."""
    from recserve.planners.fleet_candidates import SDM_DRAM_SHARE, query_batch
    from recserve.planners.sdm import plan_tier
    from recserve.specs import get_model, get_server

    host = get_server(server)
    cache_gb = plan_tier(get_model(model), SDM_DRAM_SHARE * host.mem_gb, 1.0, item_batch=query_batch(),
                         server=host).summary["cache_gb"]
    return max(TIER_CACHE_MB, int(cache_gb * 1024 * scale))


def dram_bytes(config: dict[str, Any]) -> int:
    """DRAM the embedding tables of ``config``'s catalogue models take on a node: every table not on an SSD tier at
    4 bytes a value (the node builds fp32 tables whatever the catalogue's bytes a value), shared by a model's
    workers, plus each tier's caches.  A repository model's tables are its file's: not counted."""
    total = 0
    for m in config["models"]:
        try:
            spec = get_model(m["model"])
        except RecserveError:
            continue
        rows, on_ssd = spec.scaled_rows(m["scale"]), set()
        if "tier" in (m.get("options") or {}):
            from recserve.embedding.tiered import tier_layout  # torch: only where a model is tiered

            ids, caches = tier_layout(spec.tables, m["options"]["tier"], f"model {m.get('name') or m['model']!r} tier")
            on_ssd, total = set(ids), total + caches
        total += sum(rows[t] * table.dim * 4 for t, table in enumerate(spec.tables) if t not in on_ssd)
    return total


def cores_run(model: dict[str, Any]) -> int:
    """Cores a model runs, from a plan's allocation or a node config's model entry (the same keys): its workers
    (whole-model, or dense in a pipeline) and sparse workers, each on ``threads`` cores."""
    return (model.get("workers", 1) + (model.get("sparse_workers") or 0)) * model.get("threads", 1)


def fleet_node_configs(plan: FleetPlan, scale: float = 1e-3, cores: list[int] | None = None,
                       tier_dir: str | Path = "tiers") -> tuple[list[dict[str, Any]], list[str]]:
    """(node configs, notes): one per server group of the plan, scaled onto ``cores`` (default: this process's).
    Each model keeps the configuration the plan chose for it (threads per worker, sub-batch size, pipeline mode):
    only its worker counts are scaled, by the share of the planned cores this host has."""
    host = sorted(cores or os.sched_getaffinity(0))
    groups = [g for g in plan.groups if g.kind in ("single", "pair")]
    notes = [f"{g.count} x shards on {g.server} ({', '.join(g.qps)}): not deployed locally, run `recserve shards "
             "serve`" for g in plan.groups if g.kind == "shards"]
    if not groups:
        raise RecserveError("the plan has no single-model or co-located server to deploy locally")
    share = len(host) / (sum(cores_run(a) for g in groups for a in g.alloc.values()) or 1)
    next_core = 0
    configs = []
    for i, g in enumerate(groups):
        models = []
        for m in g.qps:
            entry, next_core = _model_entry(m, g.alloc.get(m, {}), host, share, next_core, scale)
            if g.tier.get(m) == "ssd":  # SDM's host rate: CPU workers, whatever the server has
                entry["options"] = {"tier": {"dir": str(Path(tier_dir) / f"group{i}-{m}"), "tables": "user",
                                             "cache_mb": tier_cache_mb(m, g.server, scale)}}
            elif accel := accelerator_section(get_server(g.server), g.alloc.get(m, {}), entry,
                                              f"{g.kind} group on {g.server} ({', '.join(g.qps)})"):
                entry["accelerator"] = accel
            models.append(entry)
        configs.append({"host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "models": models,
                        "_group": f"{g.count} x {g.kind} on {g.server}", "_server": g.server})
    threads = sum(m["workers"] * m["threads"] + m.get("sparse_workers", 0) * m["threads"]
                  for cfg in configs for m in cfg["models"])
    if threads > len(host):
        notes.append(f"{len(configs)} node(s) run {threads} worker threads on {len(host)} core(s) of this host: they "
                     "take turns, so latency and max load measured here understate what the plan's servers carry")
    if plan.notes:
        notes += [n for n in plan.notes if n.startswith("short of peak")]
    return configs, notes


def _model_entry(model: str, alloc: dict[str, Any], host: list[int], share: float, next_core: int,
                 scale: float) -> tuple[dict[str, Any], int]:
    """One model's node config entry, its workers pinned from ``next_core`` on; and the next core."""
    threads = min(max(1, int(alloc.get("threads", 1))), len(host))
    workers = max(1, min(len(host) // threads, round(alloc.get("workers", 1) * share)))
    pinned = []
    for _ in range(workers):
        pinned.append([host[(next_core + k) % len(host)] for k in range(threads)])
        next_core += threads
    entry: dict[str, Any] = {"model": model, "name": served_name(model), "scale": scale, "workers": workers,
                             "threads": threads, "cores": pinned}
    if alloc.get("batch"):
        entry["sub_batch"] = int(alloc["batch"])
    if alloc.get("mode") == "pipeline":
        entry["mode"] = "pipeline"
        entry["sparse_workers"] = max(1, round((alloc.get("sparse_workers") or 1) * share))
    return entry, next_core


@dataclass
class LocalNode:
    config_path: Path
    http_port: int                  # 0 until the node names the port it bound (its ready line)
    models: list[str]               # the plan's model names
    group: str
    process: subprocess.Popen
    log_path: Path
    served: dict[str, str] = field(default_factory=dict)  # plan's model name -> the name it is served under
    restarts: list[float] = field(default_factory=list)  # when ``keep_nodes`` started it again (monotonic)
    restarted_at: float | None = None  # when it was last started again, until it says ready (monotonic)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def _launch(config_path: Path, log_path: Path) -> subprocess.Popen:
    """``recserve serve --config`` in its own session, its output appended to ``log_path``; it stops when this
    process ends, however that ends (``recserve/tethered.py``)."""
    with open(log_path, "ab") as log:  # the child holds its own copy of the file
        return subprocess.Popen(tethered.command("serve", "--config", str(config_path)),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _ready(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False


def start_nodes(configs: list[dict[str, Any]], workdir: str | Path, ready_timeout_s: float = 300.0,
                progress: Any = None) -> list[LocalNode]:
    """Write each config and start ``recserve serve --config`` for it; wait until every node says ready."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    nodes: list[LocalNode] = []
    try:
        for i, cfg in enumerate(configs):
            body = {k: v for k, v in cfg.items() if not k.startswith("_")}
            body["http_port"], body["grpc_port"] = 0, 0  # it binds free ones and names them (tethered.ready_ports)
            path = workdir / f"node{i}.yaml"
            path.write_text(yaml.safe_dump(body, sort_keys=False))
            log_path = workdir / f"node{i}.log"
            log_path.write_bytes(b"")
            nodes.append(LocalNode(path, 0, [m["model"] for m in body["models"]],
                                   cfg.get("_group", ""), _launch(path, log_path), log_path,
                                   {m["model"]: m["name"] for m in body["models"]}))
        deadline = time.monotonic() + ready_timeout_s
        for i, node in enumerate(nodes):
            while not (node.http_port and _ready(node.url)):
                if not node.http_port and (ports := tethered.ready_ports(node.log_path.read_bytes())):
                    _keep_ports(node, *ports)
                    if progress:
                        progress(f"node {i}: {', '.join(node.models)} ({node.group}) on {node.url}")
                    continue
                if node.process.poll() is not None:
                    raise RecserveError(f"node {i} exited with {node.process.returncode}; see "
                                        f"{workdir / f'node{i}.log'}")
                if time.monotonic() > deadline:
                    raise RecserveError(f"node {i} not ready after {ready_timeout_s:g} s; see "
                                        f"{workdir / f'node{i}.log'}")
                time.sleep(0.5)
    except BaseException:
        stop_nodes(nodes)
        raise
    return nodes


def _keep_ports(node: LocalNode, http_port: int, grpc_port: int) -> None:
    """The ports a node bound, kept in its config: started again (``keep_nodes``) it takes the same ones, so its
    endpoints and the router stay valid."""
    node.http_port = http_port
    body = yaml.safe_load(node.config_path.read_text())
    body["http_port"], body["grpc_port"] = http_port, grpc_port
    node.config_path.write_text(yaml.safe_dump(body, sort_keys=False))


def keep_nodes(nodes: list[LocalNode], seconds: float | None, max_restarts: int = 3, progress: Any = None,
               poll_s: float = 1.0) -> None:
    """Watch the node servers for ``seconds`` (None: until interrupted).  A node that exits is reported (how it
    ended, its log's last line) and started again on its ports, so its endpoints and the router stay valid; a node
    that exits once more after ``max_restarts`` restarts within ``RESTART_WINDOW_S`` raises :class:`RecserveError`
    (the caller stops the fleet)."""
    say = progress or (lambda _text: None)
    end = None if seconds is None else time.monotonic() + seconds
    while end is None or time.monotonic() < end:
        for i, node in enumerate(nodes):
            code = node.process.poll()
            if code is None:
                if node.restarted_at is not None and _ready(node.url):
                    say(f"node {i} is ready again after {time.monotonic() - node.restarted_at:.1f} s")
                    node.restarted_at = None
                continue
            what = (f"node {i} ({', '.join(node.models)}) {how_it_ended(code)}; the last line of {node.log_path}: "
                    f"{''.join(log_tail(node.log_path))!r}")
            now = time.monotonic()
            node.restarts = [t for t in node.restarts if now - t < RESTART_WINDOW_S]
            if len(node.restarts) >= max_restarts:
                raise RecserveError(f"{what}; it was started again {len(node.restarts)} time(s) in the last "
                                    f"{RESTART_WINDOW_S / 60:g} minutes (--max-restarts {max_restarts}): stopping "
                                    "every node")
            node.restarts.append(now)
            say(f"{what}; starting it again ({len(node.restarts)} of at most {max_restarts} in "
                f"{RESTART_WINDOW_S / 60:g} minutes)")
            node.process, node.restarted_at = _launch(node.config_path, node.log_path), now
        time.sleep(poll_s if end is None else max(0.0, min(poll_s, end - time.monotonic())))


def stop_nodes(nodes: list[LocalNode], timeout_s: float = 20.0) -> None:
    """Terminate the node servers this deployment started (each by its own pid), then wait."""
    for node in nodes:
        if node.process.poll() is None:
            node.process.terminate()
    for node in nodes:
        try:
            node.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()
