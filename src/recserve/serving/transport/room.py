"""Room for a new connection on a server at its connection cap: rather than refuse it while connections that wait
for a request hold every slot (they cost a client nothing and would hold them for the idle timeout, refusing every
new client, health probes included), close those that have waited longest, as nginx's ``ngx_drain_connections``
does with its idle keep-alive connections.  A client whose idle connection is closed opens another (RFC 9112 9.3;
an HTTP/2 one after GOAWAY).  Sans-IO: the caller says which connections wait and since when."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any, TypeVar

DRAIN_MAX = 32  # connections closed at once to make room (nginx's): an eighth of those waiting, at least one
RESCAN_S = 0.1  # after finding none to close, new connections past the cap are refused this long before a new look

T = TypeVar("T")


class Room:
    """One server's view of its connections at its cap (``pick``)."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until = 0.0  # no connection to close was found: until then, none is looked for

    def pick(self, waiting: Iterable[tuple[Any, T]], now: float) -> list[T]:
        """Of ``waiting`` (each connection waiting for a request, after its rank: since when it has waited, or a
        tuple ordering kinds of waiting first), those to close for a new connection: the first ranked, an eighth
        of them and ``DRAIN_MAX`` at most.  None waiting: [], and the
        connections are not looked at again for ``RESCAN_S`` (a flood of new ones does not rescan them each)."""
        if now < self._until:
            return []
        found = list(waiting)
        if not found:
            self._until = now + RESCAN_S
            return []
        count = max(1, min(DRAIN_MAX, len(found) // 8))
        return [conn for _, conn in heapq.nsmallest(count, found, key=lambda pair: pair[0])]
