"""The node config's ``tier:`` section (and a repository model's ``tiering:``) as a schema.

Every key is checked before anything is written or allocated, so a bad value is one line naming the field
(``model 'm1' tier: policy: must be 'lru', 'clock' or 'lfu', got 'fifo'``), never a traceback from the row cache
or a node that serves with a setting that cannot work (a negative cache, no IO allowed in flight).
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictFloat, StrictInt, field_validator

from recserve.embedding.blockio import ENGINES, RING_ENTRIES
from recserve.embedding.rowcache import POLICIES
from recserve.hostinfo import memory_mb
from recserve.schema import Schema, integer

MAX_TABLES_IN_FLIGHT = 256
"""Tables read at the same time (one thread each); far above any model's table count, it only bounds threads."""


def _yaml_number(value: Any) -> Any:
    """A numeric string as its number: YAML 1.1 reads ``1e3`` (no dot) as a string."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    return value


MegaBytes = Annotated[StrictFloat, BeforeValidator(_yaml_number), Field(ge=0, allow_inf_nan=False)]
Tables = str | StrictInt | list[str | StrictInt]


class TierSettings(Schema):
    """A ``tier:`` section; field meanings in docs/sdm.md ("Serving from a node config")."""

    dir: str
    tables: Tables = "user"
    cache_mb: MegaBytes = 64.0
    dtype: Literal["fp32", "int8"] = "fp32"
    policy: Literal[POLICIES] = "clock"
    pooled_cache_mb: MegaBytes = 0.0
    pooled_min_len: integer(1) = 4
    engine: Literal[ENGINES] = "auto"
    max_outstanding: integer(1, RING_ENTRIES) = 32  # a ring holds no more IOs than its entries
    no_cache: Tables | None = None
    verify: bool = True
    prefetch: bool = True
    tables_in_flight: integer(1, MAX_TABLES_IN_FLIGHT) = 4

    @field_validator("cache_mb", "pooled_cache_mb")
    @classmethod
    def _fits_in_memory(cls, mb: float) -> float:
        """A cache is allocated up front in DRAM: more than the host has can never be allocated."""
        limit = memory_mb()
        if limit is not None and mb > limit:
            raise ValueError(f"must be at most this host's memory ({limit:,.0f} MiB), got {mb:g}")
        return mb
