"""Request plans, shared by HTTP and gRPC: a request sent again but for its tensors' bytes is read by its plan (views
of those bytes, checked for size and values) instead of being parsed whole; plans are kept per transport in a
bounded store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from recserve.serving.wire.codec.tensors import check_inputs

RawPlan = tuple[tuple[str, np.dtype, tuple[int, ...], int], ...]
"""Each input's name, wire dtype, shape and byte count, in request order (:func:`grpc_raw_plan`,
:func:`http_raw_plan`): what a request sent again but for its tensors' bytes needs (:func:`parse_raw`)."""
PLANS = 64  # plans a worker remembers per transport; more distinct requests start it over (plans do not pay then)
PLAN_KEY_BYTES = 4096  # a request whose bytes besides its tensors exceed this is not remembered (a header is
# ~0.3-0.5 KB; a long id or unknown fields, up to the JSON limit, would otherwise hold PLANS x 16 MB)


class PlanStore:
    """Plans by the bytes of their request besides its tensors (HTTP's JSON header, gRPC's message without its raw
    contents), bounded for both transports alike: at most ``PLANS``, each key at most ``PLAN_KEY_BYTES``."""

    def __init__(self) -> None:
        self._plans: dict[bytes, Any] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key: bytes) -> Any:
        return self._plans.get(key)

    def remember(self, key: bytes, plan: Any) -> None:
        """Keep ``plan`` for ``key``, unless the key is too long to hold; a full store starts over (a client whose
        ids or shapes change on every call: plans do not pay then)."""
        if len(key) > PLAN_KEY_BYTES:
            return
        if len(self._plans) >= PLANS:
            self._plans.clear()
        self._plans[key] = plan


def parse_raw(plan: RawPlan, raw: Sequence[Any], checked: bool = True) -> dict[str, np.ndarray] | None:
    """The input arrays of a request with ``plan``'s other fields and raw contents ``raw`` (views, not copied), as
    :func:`parse_grpc_infer` or :func:`parse_http_infer` would return them; None when the contents do not fit the
    plan (the whole decode then says why).  The checks of the values themselves (:func:`check_inputs`) run on every
    request, unless ``checked`` is False: the caller then owes them."""
    if len(raw) != len(plan):
        return None
    arrays = {}
    for (name, dtype, dims, size), contents in zip(plan, raw, strict=True):
        if len(contents) != size:
            return None
        arrays[name] = np.ndarray(dims, dtype, contents)  # one call, cheaper than frombuffer + reshape
    if checked:
        check_inputs(arrays)
    return arrays
