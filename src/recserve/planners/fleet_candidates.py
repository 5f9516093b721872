"""The fleet planner's columns: every way one server type can carry part of a model's load, each made by the
single-paper planner that owns that decision (none of their rules is copied here).

- ``single``: one model alone on a server, in the node configuration Hercules' search finds
  (:func:`recserve.planners.hercules.search.search` over the perfmodel's ``config -> max load``).
- ``single`` with ``tier: ssd`` (where the whole model has no DRAM column on the type): the model's SM tables on
  the server's SSD behind the row cache, at the rate SDM's host model gives
  (:func:`recserve.planners.sdm.sdm_host_qps`): a model too large for the type's DRAM becomes placeable there.
- ``pair``: two models sharing a CPU server, the cores and LLC ways split by Hera's node allocation
  (:func:`recserve.planners.hera.pair_allocation` on the models' Profile tables for that type).
- ``shards`` (where the whole model has no DRAM column on the type: it does not fit, or misses the SLA whole, so
  sharding changes what can be replicated; where it fits, a server's throughput is compute-bound either way and
  the Hercules column already prices it): the whole model split ElasticRec's way
  (:func:`recserve.planners.elasticrec.plan_shards`: hot/cold shards each replicated for its own traffic),
  packed onto servers of one type (:func:`~recserve.planners.elasticrec.pack_servers`): a block serving
  the model's whole peak.

A column says what one unit (a server, or the shard block) serves of each model, so the instance mix
(Kairos' question) and the counts (Hercules' provisioning) are left to the ILP in ``fleet.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recserve.errors import RecserveError
from recserve.planners.fleet_spec import FleetModel, FleetSpec
from recserve.profiles import ProfileSet
from recserve.specs import ModelSpec, ServerType

SDM_DRAM_SHARE = 0.75
"""SDM's DRAM budget for embeddings (FM: direct tables + row cache) as a share of the server's memory; the rest
holds the dense weights, activations and the OS.  An input assumption, the same for the SDM-alone baseline."""
PROGRESS_EVERY_S = 5.0  # a server type whose candidates take longer says which model it is at, this often


@dataclass
class Column:
    """One unit the ILP may buy ``count`` of: a server (``single``/``pair``) or a shard block (``shards``)."""

    kind: str                    # single | pair | shards
    server: str
    qps: dict[str, float]        # model -> QPS one unit serves within the model's SLA
    servers: int = 1             # servers one unit occupies
    tier: dict[str, str] = field(default_factory=dict)   # model -> dram | ssd
    config: str = ""
    why: str = ""
    block: bool = False          # at most one (the shard block serves the whole peak)
    alloc: dict[str, dict[str, Any]] = field(default_factory=dict)  # model -> workers, threads, batch, mode

    @property
    def label(self) -> str:
        return " + ".join(self.qps)


Progress = Callable[[str], None]
_CACHE: dict[tuple, Any] = {}   # (what, model, sla, server) -> result: the benchmark plans many scenarios


def _key(what: str, spec: ModelSpec, server: ServerType) -> tuple:
    return what, spec.name, spec.sla, server.name


def query_batch(perfmodel: Any = None) -> int:
    """Items per query the SDM and ElasticRec models take: the production size mix's mean."""
    from recserve.perfmodel import SizeMix

    return max(1, int(round(SizeMix.of(None).mean)))


def hercules_capacity(spec: ModelSpec, server: ServerType, perfmodel: Any) -> tuple[float, str, str]:
    """(max QPS at the SLA, configuration label, reason when 0) of Hercules' search on the perfmodel."""
    return hercules_search(spec, server, perfmodel)[:3]


def hercules_search(spec: ModelSpec, server: ServerType, perfmodel: Any) -> tuple[float, str, str, dict[str, Any]]:
    """:func:`hercules_capacity` and the configuration as node-config fields (workers, threads, batch, mode)."""
    key = _key("hercules", spec, server)
    if key not in _CACHE:
        from recserve.perfmodel import SizeMix
        from recserve.perfmodel.evaluator import perfmodel_evaluator
        from recserve.planners.hercules.search import SchedConfig, search

        evaluate = perfmodel_evaluator(spec, server, perfmodel, SizeMix.of(None))
        res = search(server, evaluate, spec=spec)
        if res.best is None:
            reason = evaluate.detail(SchedConfig("model", 1, 1, 32)).reason or "SLA missed at every configuration"
            _CACHE[key] = (0.0, "", reason, {})
        else:
            b = res.best
            alloc = {"workers": b.threads, "threads": b.cores_per_thread, "batch": b.batch, "mode": b.mode,
                     "sparse_workers": b.sparse_threads}
            _CACHE[key] = (res.best_qps, b.label(), "", alloc)
    return _CACHE[key]


def sdm_capacity(spec: ModelSpec, server: ServerType, perfmodel: Any) -> tuple[float, str]:
    """SDM host rate with the user-side tables on the server's SSD (0 and why where it cannot serve)."""
    key = _key("sdm", spec, server)
    if key not in _CACHE:
        from recserve.planners.sdm import sdm_host_qps

        try:
            _CACHE[key] = sdm_host_qps(spec, server, SDM_DRAM_SHARE * server.mem_gb, query_batch(), perfmodel=perfmodel)
        except RecserveError as exc:
            _CACHE[key] = (0.0, str(exc))
    return _CACHE[key]


def shard_block(spec: ModelSpec, server: ServerType, target_qps: float, perfmodel: Any) -> tuple[int, str]:
    """Servers of ``server`` that ElasticRec's shards for ``target_qps`` pack onto (0 and why if none)."""
    key = (*_key("shards", spec, server), round(target_qps, 6))
    if key not in _CACHE:
        from recserve.planners.elasticrec import cost_model_from_perfmodel, pack_servers, plan_replicas, plan_shards

        try:
            cost = cost_model_from_perfmodel(spec, server, query_batch(), perfmodel)
            plan = plan_shards(spec, target_qps, cost, batch=query_batch())
            sharded, _ = plan_replicas(plan, spec, cost)
            n = pack_servers(sharded, server)
            shards = sum(t.num_shards for t in plan.tables)
            _CACHE[key] = (n, f"{shards} embedding shards + dense x{plan.dense_replicas}, "
                              f"{plan.memory_bytes / 1e9:.1f} GB vs {plan.modelwise_memory_bytes / 1e9:.1f} GB "
                              "model-wise")
        except RecserveError as exc:
            _CACHE[key] = (0, str(exc).splitlines()[0])
    return _CACHE[key]


def hera_profiles(specs: list[ModelSpec], server: ServerType, perfmodel: Any) -> ProfileSet:
    """Hera's Profile tables (max load vs workers and LLC ways, bandwidth, footprint) from the perfmodel."""
    from recserve.perfmodel import SizeMix
    from recserve.perfmodel.tables import pair_tables

    out = ProfileSet(meta={"source": "recserve.perfmodel"})
    for spec in specs:
        key = _key("hera", spec, server)
        if key not in _CACHE:
            _CACHE[key] = pair_tables(perfmodel, spec, server, SizeMix.of(None))
        for t in _CACHE[key]:
            out.add(t)
    return out


def single_columns(fm: FleetModel, server: ServerType, fleet: FleetSpec, perfmodel: Any,
                   rejected: list[str]) -> list[Column]:
    out = []
    qps, label, reason, alloc = hercules_search(fm.spec, server, perfmodel)
    if qps > 0:
        out.append(Column("single", server.name, {fm.name: qps}, tier={fm.name: "dram"}, config=label,
                          alloc={fm.name: alloc},
                          why=f"Hercules search: {label} -> {qps:,.1f} QPS within {fm.sla.target_ms:g} ms "
                              f"p{fm.sla.percentile:g}"))
    else:
        rejected.append(f"{fm.name} on {server.name} in DRAM: {reason}")
    if fleet.ssd and server.ssd is not None and qps <= 0:
        # only where the whole model has no DRAM column: SDM's host rate is for queries of one size (the mix's
        # mean), Hercules' for the size mix; where both exist the SDM rate is the higher only for that reason
        sq, why = sdm_capacity(fm.spec, server, perfmodel)
        if sq > 0:
            out.append(Column("single", server.name, {fm.name: sq}, tier={fm.name: "ssd"},
                              config=f"SDM: user tables on SSD, {server.cores} workers",
                              alloc={fm.name: {"workers": server.cores, "threads": 1, "batch": None,
                                               "mode": "model"}},
                              why=f"SDM tiering: {sq:,.1f} QPS ({why}) vs {qps:,.1f} all in DRAM"
                                  + (f" ({reason})" if reason else "")))
        elif sq <= 0:
            rejected.append(f"{fm.name} on {server.name} with SSD tiering: {why}")
    return out


def pair_columns(models: list[FleetModel], server: ServerType, perfmodel: Any, rejected: list[str]) -> list[Column]:
    """Hera pairs on a CPU server type with LLC ways (Hera partitions cores and ways; no accelerator)."""
    if server.accelerator or server.llc_ways < 2 or len(models) < 2:
        return []
    from recserve.planners.hera import model_curves, pair_allocation

    profiles = hera_profiles([m.spec for m in models], server, perfmodel)
    curves = {}
    for m in models:
        try:
            curves[m.name] = model_curves(profiles, m.name, server)
        except RecserveError as exc:
            rejected.append(f"{m.name} on {server.name} co-located: {str(exc).splitlines()[0]}")
    out = []
    names = list(curves)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            try:
                plan = pair_allocation(curves[a], curves[b], server)
            except RecserveError:
                continue
            pa, pb = plan.placements
            if pa.qps <= 0 or pb.qps <= 0:
                continue
            out.append(Column("pair", server.name, {a: pa.qps, b: pb.qps}, tier={a: "dram", b: "dram"},
                              config=f"{a}: {pa.workers} workers, {pa.ways} ways; {b}: {pb.workers} workers, "
                                     f"{pb.ways} ways",
                              alloc={a: {"workers": pa.workers, "threads": 1, "ways": pa.ways, "mode": "model"},
                                     b: {"workers": pb.workers, "threads": 1, "ways": pb.ways, "mode": "model"}},
                              why=f"Hera pair (EMU {100 * plan.emu:.0f}%): {pa.qps:,.1f} + {pb.qps:,.1f} QPS on one "
                                  "server"))
    return out


def shard_columns(fm: FleetModel, server: ServerType, perfmodel: Any, rejected: list[str]) -> list[Column]:
    n, why = shard_block(fm.spec, server, fm.peak_qps, perfmodel)
    if n <= 0:
        rejected.append(f"{fm.name} on {server.name} as ElasticRec shards: {why}")
        return []
    return [Column("shards", server.name, {fm.name: fm.peak_qps}, servers=n, tier={fm.name: "dram"},
                   config=why, block=True,
                   why=f"ElasticRec shards: the whole {fm.peak_qps:,.0f} QPS peak on {n} servers ({why})")]


def columns(fleet: FleetSpec, perfmodel: Any, progress: Progress | None = None,
            pairs: bool = True, shards: bool = True) -> tuple[list[Column], list[str]]:
    """Every candidate column of the fleet, and why each (model, type, option) left out was left out."""
    out: list[Column] = []
    rejected: list[str] = []
    types = [fleet.servers[s] for s in fleet.servers if fleet.available(s) > 0]
    for t, server in enumerate(types, 1):
        if progress:
            progress(f"candidates on {server.name} ({t} of {len(types)} types): Hercules search, SDM tiering, "
                     "ElasticRec shards, Hera pairs")
        said = time.monotonic()
        for k, fm in enumerate(fleet.models, 1):
            if progress and time.monotonic() - said > PROGRESS_EVERY_S:  # a long type says where it is
                progress(f"  {server.name}: model {k} of {len(fleet.models)} ({fm.name})")
                said = time.monotonic()
            singles = single_columns(fm, server, fleet, perfmodel, rejected)
            out += singles
            if shards and not any(c.tier[fm.name] == "dram" for c in singles):
                out += shard_columns(fm, server, perfmodel, rejected)
        if pairs:
            out += pair_columns(fleet.models, server, perfmodel, rejected)
    return out, rejected
