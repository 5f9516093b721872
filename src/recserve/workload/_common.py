"""Helpers shared by the workload generators: seeded generators, ``name:k=v,...`` spec strings, errors."""

from __future__ import annotations

import numpy as np

from recserve.errors import RecserveError

RngLike = np.random.Generator | int | None


class WorkloadError(RecserveError):
    """A workload description (distribution name, parameter, trace file) is invalid."""


def as_rng(rng: RngLike) -> np.random.Generator:
    """A Generator from a seed (or the Generator itself): every generator here is reproducible by seed."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(0 if rng is None else rng)


def parse_spec(text: str) -> tuple[str, dict[str, str]]:
    """``"lognormal:mu=5.1,sigma=0.2"`` → ``("lognormal", {"mu": "5.1", "sigma": "0.2"})``.

    ``file:PATH`` keeps everything after the first colon as ``{"path": PATH}``; a bare value after the
    colon (``fixed:64``) becomes ``{"": "64"}`` for the caller to name.
    """
    text = text.strip()
    if not text:
        raise WorkloadError("empty workload spec")
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if name == "file":
        if not rest:
            raise WorkloadError("file: needs a path, e.g. file:sizes.npy")
        return name, {"path": rest}
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            key, value = "", key
        params[key.strip()] = value.strip()
    return name, params


def as_float(params: dict[str, object], key: str, default: float | None = None, *, where: str) -> float:
    if key not in params:
        if default is None:
            raise WorkloadError(f"{where}: missing parameter {key!r}")
        return default
    try:
        return float(params[key])  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: parameter {key}={params[key]!r} is not a number") from None
