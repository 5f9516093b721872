"""The messages on a worker's ``multiprocessing`` pipe to its supervisor: one definition for both ends.

On the pipe a message is a plain tuple, its tag first (``("beat", 0.01)``): ``encode`` makes it from the typed
message below and ``decode`` reads it back, so the pickled bytes stay those of a tuple (a NamedTuple would carry a
class reference).  Per-query traffic stays untyped on purpose: the items the supervisor sends a stage worker,
``(item_id, payload_or_None, descriptors_or_None)`` (``None`` alone = finish and exit), and their replies,
``(item_id, ok, result_or_message, compute_s)``, start with an int, not a tag.  A ``Conn``, ``Handoff`` or
``Adopt`` is followed on the pipe by one descriptor (SCM_RIGHTS).
"""

from __future__ import annotations

import select
from collections.abc import Callable
from typing import Any, NamedTuple


def waiting(conn: Any) -> Callable[[], bool]:
    """``conn.poll()`` without its cost: multiprocessing builds and closes a selector on every call, this keeps one
    ``select.poll`` on the pipe's descriptor.  Equivalent because a ``Connection`` reads each message whole and
    nothing ahead, so its descriptor is readable exactly when a message (or the end) waits."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return lambda: bool(poller.poll(0))


# ------------------------------------------------------------------ worker -> supervisor
class Applied(NamedTuple):
    """The live settings change numbered ``seq`` (``Config.seq``) is in effect in this worker."""

    TAG = "applied"
    seq: int


class Ready(NamedTuple):
    """The worker built its model (and listens, a worker that accepts connections)."""

    TAG = "ready"
    pid: int
    tier_io: list  # tiered tables' read path (``embedding.tiered.io_report``); [] for DRAM models


class Failed(NamedTuple):
    """The worker could not build its model (a user's file: a broken SSD-tier table, say); it exits."""

    TAG = "failed"
    reason: str


class Stats(NamedTuple):
    """Records, batched: ``("done", items, e2e_s, queue_s, compute_s, executions)``, ``("error", code, e2e_s)``,
    ``("refused", code)``, ``("read_paused",)``, ``("kind", "cpu"|"accelerator", items)``,
    ``("sibling", "forwarded"|"returned"|"copied")``; an accelerator worker's ``("pass", items, queries, seconds)`` and
    ``("cache", lookups, hits)``."""

    TAG = "stats"
    records: list


class Beat(NamedTuple):
    """Every 0.25 s: the worker's loop runs; ``busy_s``, how long its pass in flight has run (a pass that never
    ends is a hang too)."""

    TAG = "beat"
    busy_s: float = 0.0


class Conn(NamedTuple):
    """A connection the worker serves (its descriptor follows): the supervisor holds a copy, and a shared row per
    descriptor says whether a request of it is unanswered, for when the worker dies or hangs."""

    TAG = "conn"
    fd: int  # the worker's number for it


class Gone(NamedTuple):
    """The connection ``fd`` is no longer served by this worker."""

    TAG = "gone"
    fd: int


class Handoff(NamedTuple):
    """A connection the worker does not serve (its descriptor follows), with the bytes read of it; to the idle
    sibling in load slot ``to_slot`` if one is named, else to the node's router.  ``fd``: the worker's number for
    it where the supervisor holds a copy (``Conn``), which it drops once the descriptor has come (-1: none)."""

    TAG = "handoff"
    prefix: bytes
    model: str
    to_slot: int | None = None
    fd: int = -1


# ------------------------------------------------------------------ supervisor -> worker
class Adopt(NamedTuple):
    """A connection to serve (its descriptor follows), with the bytes already read of it."""

    TAG = "adopt"
    prefix: bytes


class Config(NamedTuple):
    """Live settings: ``sub_batch``, ``default``; ``min_items``, ``accel_sockets`` with accelerator workers;
    ``accepting: False`` (a worker about to retire accepts no more connections).  A change with a ``seq`` is
    answered with ``Applied(seq)`` once it is in effect."""

    TAG = "config"
    changes: dict
    seq: int = 0


class Drain(NamedTuple):
    """Stop accepting; refuse new queries with 503."""

    TAG = "drain"


Message = Applied | Ready | Failed | Stats | Beat | Conn | Gone | Handoff | Adopt | Config | Drain
KINDS: dict[str, type] = {kind.TAG: kind for kind in (Applied, Ready, Failed, Stats, Beat, Conn, Gone, Handoff, Adopt,
                                                      Config, Drain)}


def encode(message: Message) -> tuple:
    """The tuple that goes on the pipe."""
    return (message.TAG, *message)


def decode(raw: tuple) -> Any:
    """The typed message of a tagged tuple (a ``KeyError`` for an unknown tag)."""
    return KINDS[raw[0]](*raw[1:])


def tagged(raw: Any) -> bool:
    """A tagged message, not a stage item or its reply (those start with the item's id)."""
    return isinstance(raw[0], str)
