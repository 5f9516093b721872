"""The benchmarks' cached perfmodel profiles: reused only when written by the same arguments and sources."""

from __future__ import annotations

import recserve.perfmodel
from benchmarks.common import scenarios
from recserve.profiles import ProfileSet, ProfileTable


def test_cached_profiles_are_rebuilt_when_their_arguments_or_sources_change(tmp_path, monkeypatch):
    built = []

    def model_profiles(models, servers, **kw):
        built.append(kw)
        columns = ("batch", "mean_ms", "p50_ms", "p99_ms")
        return ProfileSet([ProfileTable(models[0].name, servers[0].name, "latency_vs_batch", columns,
                                        [[1.0, 1.0, 1.0, float(len(built))]], "modelled")])

    monkeypatch.setattr(recserve.perfmodel, "model_profiles", model_profiles)
    path = tmp_path / "profiles.json"
    first = scenarios.cached_profiles(path, ["hera-ncf"], ["hera-xeon"], efficiency=False)
    again = scenarios.cached_profiles(path, ["hera-ncf"], ["hera-xeon"], efficiency=False)
    assert len(built) == 1 and again.meta["cache_key"] == first.meta["cache_key"]
    scenarios.cached_profiles(path, ["hera-ncf"], ["hera-xeon"], efficiency=False, tables="copied")
    assert len(built) == 2  # other arguments
    monkeypatch.setattr(scenarios, "PROFILE_SOURCES", (*scenarios.PROFILE_SOURCES, "errors.py"))
    scenarios.cached_profiles(path, ["hera-ncf"], ["hera-xeon"], efficiency=False, tables="copied")
    assert len(built) == 3  # other sources (a file written before this check had no key at all: rebuilt too)
