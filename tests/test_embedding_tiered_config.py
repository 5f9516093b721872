"""The node config's ``tier:`` section: every bad value is one line naming the field, before anything is written."""

from __future__ import annotations

import os

import pytest
import yaml

from recserve.cli import main
from recserve.embedding.tiered import tier_from_config
from recserve.errors import SpecError
from recserve.specs import SLA, ModelSpec, TableSpec
from recserve.zoo import build


def small_model():
    tables = (TableSpec("u0", 300, 8, pooling=4, side="user"), TableSpec("i0", 50, 8, pooling=2, side="item"))
    return build(ModelSpec("sdm-cfg", "dlrm", 8, tables, "dot", SLA(50.0), bottom_mlp=(16, 8), top_mlp=(8, 1)),
                 scale=1.0)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("policy", "fifo", "policy: must be 'lru', 'clock' or 'lfu', got 'fifo'"),
    ("cache_mb", 1e12, "cache_mb: must be at most this host's memory"),
    ("cache_mb", "1e12", "cache_mb: must be at most this host's memory"),
    ("cache_mb", -1, "cache_mb: must be >= 0, got -1"),
    ("pooled_cache_mb", -0.5, "pooled_cache_mb: must be >= 0"),
    ("max_outstanding", 0, "max_outstanding: must be >= 1, got 0"),
    ("max_outstanding", 100_000, "max_outstanding: must be <= 256"),
    ("tables_in_flight", 0, "tables_in_flight: must be >= 1"),
    ("pooled_min_len", 0, "pooled_min_len: must be >= 1"),
    ("engine", "aio", "engine: must be 'auto', 'io_uring' or 'threads'"),
    ("dtype", "fp16", "dtype: must be 'fp32' or 'int8'"),
    ("verify", "maybe", "verify: must be true or false"),
])
def test_bad_tier_values_are_one_line_naming_the_field_and_write_nothing(tmp_path, key, value, message):
    tier_dir = tmp_path / "tier"
    with pytest.raises(SpecError) as err:
        tier_from_config(small_model(), {"dir": str(tier_dir), key: value}, "model 'm1' tier")
    assert str(err.value).startswith(f"model 'm1' tier: {message}"), str(err.value)
    assert not tier_dir.exists(), "nothing is created for a config that is refused"


def test_yaml_exponent_strings_are_numbers(tmp_path):
    resources = tier_from_config(small_model(), {"dir": str(tmp_path), "cache_mb": "5e-2"})
    assert resources.row_cache is not None and resources.row_cache.capacity_bytes > 0


def test_serve_with_a_bad_tier_policy_is_one_line_exit_2(tmp_path, capsys):
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"http_port": 0, "grpc_port": 0, "models": [{
        "model": "sdm-m1", "name": "m1", "scale": 2e-5, "workers": 1,
        "options": {"tier": {"dir": str(tmp_path / "tier"), "tables": "user", "policy": "fifo"}}}]}))
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "recserve: error: model 'm1' tier: policy: must be 'lru', 'clock' or 'lfu', got 'fifo'", err
    assert not os.path.exists(tmp_path / "tier")


def test_a_row_cache_too_small_for_one_row_is_refused_not_silently_off(tmp_path):
    tier_dir = tmp_path / "tier"
    with pytest.raises(SpecError) as err:
        tier_from_config(small_model(), {"dir": str(tier_dir), "cache_mb": 1e-6}, "model 'm1' tier")
    assert str(err.value).startswith("model 'm1' tier: cache_mb: 1e-06 MiB holds no row of these tables (32 bytes"), \
        str(err.value)
    assert not tier_dir.exists()
    assert tier_from_config(small_model(), {"dir": str(tier_dir), "cache_mb": 0}).row_cache is None
