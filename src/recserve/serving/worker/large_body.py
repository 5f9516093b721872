"""A large HTTP request body received in place, over many reads, into a buffer of its size (``LargeBody``), within
the worker's budget of bytes such bodies hold (``ByteBudget``).

Why in place: appending megabytes to a growing buffer re-copied it on every chunk (~60% of a worker's CPU at
1.9 MB requests); received straight into its buffer (``recv_into``), each byte is copied once, and the decoded
tensors view it.  Small bodies never come here: they are read with their head (``http_connection.Connection``).
"""

from __future__ import annotations

from recserve.serving.transport.h2limits import ByteBudget
from recserve.serving.transport.http1 import digits
from recserve.serving.wire import codec


class LargeBody:
    """One body being received: its buffer (uninitialised; binary tensors after the JSON header aligned,
    ``codec.aligned_buffer``), how much of it has arrived, and the head it came with (what a hand-off passes on)."""

    __slots__ = ("buffer", "filled", "head", "_budget", "_held")

    def __init__(self, budget: ByteBudget, size: int, json_length: str, head: bytes, got: bytes | bytearray) -> None:
        lead = int(json_length) if digits(json_length) and int(json_length) < size else 0
        self.buffer = codec.aligned_buffer(size, lead)
        self.buffer[: len(got)] = got
        self.filled = len(got)
        self.head = head
        self._budget, self._held = budget, size
        budget.add(size)

    @classmethod
    def start(cls, budget: ByteBudget, size: int, json_length: str, head: bytes,
              got: bytes | bytearray) -> LargeBody | None:
        """The body of ``size`` bytes (``got``: its first ones, ``json_length``: its JSON header's), or None when
        ``budget`` cannot take it."""
        if budget.used + size > budget.limit:
            return None
        return cls(budget, size, json_length, head, got)

    @property
    def whole(self) -> bool:
        return self.filled == len(self.buffer)

    def free(self) -> memoryview:
        """Where the next read goes."""
        return self.buffer[self.filled :]

    def received(self, nbytes: int) -> bool:
        """``nbytes`` more were read into ``free()``; whether the body is whole."""
        self.filled += nbytes
        return self.filled == len(self.buffer)

    def take(self, data: bytes | memoryview) -> bytes | memoryview:
        """Copy in what of ``data`` belongs to the body; the rest (the next request's first bytes)."""
        take = min(len(data), len(self.buffer) - self.filled)
        self.buffer[self.filled : self.filled + take] = data[:take]
        self.filled += take
        return data[take:]

    def release(self) -> memoryview:
        """The body leaves the budget (received whole and handed on, or abandoned); its buffer."""
        self._budget.add(-self._held)
        self._held = 0
        return self.buffer

    def pending(self) -> bytes:
        """The head and what of the body has arrived, as received."""
        return self.head + bytes(self.buffer[: self.filled])
