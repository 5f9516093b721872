"""A router's pool file: the backends a live router dispatches over, its policy and its limits.

Pool file (YAML)::

    qos_ms: 50            # p99 target the policy plans for
    policy: kairos        # kairos | ribbon | drs | clockwork
    drs_threshold: 300    # for drs: queries larger than this go to base types
    queue_limit: 1024     # queries waiting for a backend slot; past it 503 + Retry-After
    deadline_ms: 100      # a query waiting longer for a slot is answered 504 (default 2 x qos_ms)
    prior:                # optional: seed the latency predictor from measured latency_vs_batch tables
      profiles: profiles/backends.json   # tables whose server name is the backend type
      model: kairos-wnd
    backends:
      - {url: http://127.0.0.1:8001, type: fast, slots: 1, base: true}
      - {url: http://127.0.0.1:8002, type: slow, slots: 1}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from recserve.errors import SpecError
from recserve.measure.http_client import Endpoint
from recserve.policies.dispatch import DispatchPolicy, make_policy
from recserve.policies.predictor import LatencyPredictor, prior_from_profiles
from recserve.schema import Schema, integer, number
from recserve.serving.node.config import DEADLINE_SLA_FACTOR
from recserve.specs import read_yaml

QUEUE_LIMIT = 1024  # queries waiting for a backend slot, by default


@dataclass
class Backend:
    url: str
    type: str
    slots: int = 1
    base: bool = False


@dataclass
class PoolConfig:
    backends: list[Backend]
    qos_ms: float
    policy: str = "kairos"
    drs_threshold: int = 300
    prior: dict[str, np.ndarray] | None = None  # backend type -> mean latency per predictor bucket
    queue_limit: int = QUEUE_LIMIT  # queries waiting for a slot; past it 503
    deadline_ms: float | None = None  # a query waiting longer for a slot is answered 504; None: 2 x qos_ms

    def deadline(self) -> float:
        """Milliseconds a query may wait for a backend slot (the node's default rule: twice the target)."""
        return self.deadline_ms if self.deadline_ms is not None else DEADLINE_SLA_FACTOR * self.qos_ms

    def instance_pool(self) -> tuple[list[str], list[str]]:
        """(type per instance, url per instance): each slot is one instance."""
        types, urls = [], []
        for b in self.backends:
            types += [b.type] * b.slots
            urls += [b.url.rstrip("/")] * b.slots
        return types, urls

    def make_policy(self, name: str | None = None) -> DispatchPolicy:
        name = name or self.policy
        base = [b.type for b in self.backends if b.base] or [self.backends[0].type]
        types = list(dict.fromkeys(b.type for b in self.backends))
        predictor = LatencyPredictor(types, prior=self.prior) if self.prior else None
        return make_policy(name, self.qos_ms, threshold=self.drs_threshold, base_types=base, predictor=predictor)


class BackendFile(Schema):
    url: str
    type: str | None = None  # default b<index>
    slots: integer(1) = 1
    base: bool = False


class PriorFile(Schema):
    profiles: str  # a ProfileSet file with latency_vs_batch tables whose server name is the backend type
    model: str


class PoolFile(Schema):
    """A pool file (module docstring)."""

    qos_ms: number(gt=0)
    backends: list[BackendFile] = Field(min_length=1)
    policy: Literal["kairos", "ribbon", "drs", "clockwork"] = "kairos"
    drs_threshold: integer(0) = 300
    prior: PriorFile | None = None
    queue_limit: integer(1) = QUEUE_LIMIT
    deadline_ms: number(gt=0) | None = None


def load_pool(path: str | Path) -> PoolConfig:
    found = PoolFile.parse(read_yaml(path), str(path))
    backends = []
    for i, b in enumerate(found.backends):
        try:
            Endpoint.parse(b.url)
        except ValueError as exc:
            raise SpecError(f"{path}: backends[{i}].url: {exc}") from None
        backends.append(Backend(b.url, b.type if b.type is not None else f"b{i}", b.slots, b.base))
    prior = None
    if found.prior is not None:
        from recserve.profiles import ProfileSet

        types = [b.type for b in backends]
        prior = prior_from_profiles(ProfileSet.load(found.prior.profiles), found.prior.model, types)
        if not prior:
            raise SpecError(f"{path}: {found.prior.profiles} has no latency_vs_batch table of {found.prior.model!r} "
                            f"on any backend type {sorted(set(types))}")
    return PoolConfig(backends, found.qos_ms, found.policy, found.drs_threshold, prior, found.queue_limit,
                      found.deadline_ms)

