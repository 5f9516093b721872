"""Catalogue models and perfmodel profiles of the papers' scenarios, shared by bench_planners and bench_papers:
Hera's and Hercules' model lists, Hercules' server counts, profiles cached on disk, the Kairos pool scenario."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from recserve.planners.kairos import load_kairos_reference
from recserve.profiles import ProfileSet

HERA_MODELS = ["hera-dlrm-a", "hera-dlrm-b", "hera-dlrm-c", "hera-dlrm-d", "hera-ncf", "hera-dien", "hera-din",
               "hera-wnd"]
HERCULES_MODELS = ["hercules-rmc1", "hercules-rmc2", "hercules-rmc3", "hercules-mtwnd", "hercules-din",
                   "hercules-dien"]
HERCULES_AVAILABLE = dict(zip([f"hercules-t{i}" for i in range(1, 11)], [100, 100, 15, 10, 5, 10, 5, 6, 4, 2],
                              strict=True))


# what modelled profiles are computed from: a change to any of these makes a cached file stale
PROFILE_SOURCES = ("perfmodel", "zoo", "catalogue", "planners/hercules", "specs.py", "profiles.py")


def profiles_key(models: list[str], servers: list[str], kw: dict) -> str:
    """A digest of the arguments and of every source file the profiles are computed from."""
    import recserve

    root = Path(recserve.__file__).parent
    digest = hashlib.sha256(json.dumps([models, servers, sorted(kw.items())], default=str).encode())
    for name in PROFILE_SOURCES:
        top = root / name
        for f in sorted(top.rglob("*") if top.is_dir() else [top]):
            if f.is_file() and f.suffix in (".py", ".json", ".yaml", ".yml"):
                digest.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
    return digest.hexdigest()[:16]


def cached_profiles(path: Path, models: list[str], servers: list[str], **kw) -> ProfileSet:
    """The perfmodel's profiles of ``models`` on ``servers``, from ``path`` if it was written by the same arguments
    and sources (``profiles_key``), else modelled afresh and written there."""
    key = profiles_key(models, servers, kw)
    if path.exists():
        cached = ProfileSet.load(path)
        if cached.meta.get("cache_key") == key:
            return cached
    from recserve.perfmodel import model_profiles
    from recserve.planners.hercules.search import efficiency_tables
    from recserve.specs import get_model, get_server

    print(f"modelling {len(models)} models on {len(servers)} server types (cached in {path})", file=sys.stderr)
    kw["extra"] = efficiency_tables if kw.pop("efficiency", True) else None
    profiles = model_profiles([get_model(m) for m in models], [get_server(s) for s in servers], **kw)
    profiles.meta["cache_key"] = key
    return ProfileSet.load(profiles.save(path))


HERA_PROFILES = "profiles_hera.json"


def hera_profiles(results_dir: Path) -> ProfileSet:
    """The perfmodel's profiles of Hera's eight models on hera-xeon (a table copy per worker), cached under
    ``results_dir``."""
    return cached_profiles(results_dir / HERA_PROFILES, HERA_MODELS, ["hera-xeon"], tables="copied", efficiency=False)


def scenario_kairos(reference: Path) -> dict:
    from recserve.planners.kairos import plan_pool

    profiles = load_kairos_reference(reference)
    meta = profiles.meta
    plan = plan_pool(profiles, sorted(meta["qos_p99_ms"]), meta["budget_usd_per_hr"], meta["prices_usd_per_hr"],
                     meta["qos_p99_ms"], meta["max_instances"])
    return {p.model: {"config": p.config, "cost": p.cost_per_hr, "upper_bound_qps": p.upper_bound_qps,
                      "highest_bound_config": p.details["highest_bound_config"], "homogeneous": p.homogeneous,
                      "gain": p.upper_bound_qps / p.homogeneous["qps"]} for p in plan.pools}
