"""Per-connection budgets for HTTP/2 frames that cost a server work but carry no request.

The public HTTP/2 floods (CVE-2019-9512 PING, -9515 SETTINGS, -9518 empty frames, Rapid Reset CVE-2023-44487,
the 2024 CONTINUATION flood, and the frames that change nothing which nghttp2 counts as "glitches": PRIORITY,
unknown types, WINDOW_UPDATEs for data we never sent) keep a server's loop busy with frames a well-behaved client
sends a few of.  Each budget here is what nghttp2 or Envoy allow; past one the connection gets GOAWAY
ENHANCE_YOUR_CALM, as nghttp2 and grpc-core answer.  Sans-IO: the caller passes frames' facts in and a clock, and
gets a reason back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    """A token bucket: ``burst`` frames at once, refilled at ``per_s`` a second."""

    burst: float
    per_s: float


@dataclass(frozen=True)
class FloodLimits:
    pings: Rate = Rate(100, 10)  # PINGs needing an answer; grpc-core calls more "too_many_pings"
    settings: Rate = Rate(100, 10)  # SETTINGS needing an acknowledgement
    resets: Rate = Rate(1000, 33)  # RST_STREAM from the client: nghttp2's stream-reset rate limit
    server_resets: Rate = Rate(2000, 200)  # the same over a server's (a worker's) connections: reconnecting
    # after each GOAWAY does not buy a Rapid Reset client a fresh budget
    glitches: Rate = Rate(1000, 33)  # frames that change nothing: nghttp2's glitch rate limit
    empty_data: int = 16  # DATA frames in a row with no payload and no END_STREAM (Envoy allows 1)
    continuations: int = 8  # CONTINUATION frames in one header block: nghttp2's default
    # receive windows (RFC 9113 6.9): what a client may send before we replenish; replenished as DATA is taken
    # into a message we will serve, so a stream answered or refused gets no more, and DATA past a window is a
    # FLOW_CONTROL_ERROR.  grpc-core starts at 64 KiB and grows to a few MiB; Envoy and nghttp2 set similar caps.
    # A stream's is larger than a production-mix query (1.5-1.8 MB), so one needs no WINDOW_UPDATE; what a
    # connection's streams hold at once stays bounded by the connection's window and the held-bytes budgets.
    stream_window: int = 4 << 20
    connection_window: int = 16 << 20


class Bucket:
    __slots__ = ("burst", "per_s", "tokens", "at")

    def __init__(self, rate: Rate, now: float) -> None:
        self.burst, self.per_s, self.tokens, self.at = rate.burst, rate.per_s, rate.burst, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


UPDATES_EARNED = 2  # WINDOW_UPDATEs a client may send for each DATA frame we send (the stream's window and the
# connection's) and each stream it opens (grpc-core announces its window on every stream, answered with data or not)
MAX_UPDATE_CREDIT = 4096  # earned updates banked at most


class FloodGuard:
    """One connection's budgets.  Each method returns None while the frame is within its budget, else the
    reason to send with GOAWAY ENHANCE_YOUR_CALM (also the name it is counted under)."""

    __slots__ = ("limits", "clock", "_pings", "_settings", "_resets", "_server_resets", "_glitches",
                 "update_credit", "empty_in_a_row", "continuations")

    def __init__(self, limits: FloodLimits = FloodLimits(), clock: Callable[[], float] = time.monotonic,
                 server_resets: Bucket | None = None) -> None:
        now = clock()
        self.limits, self.clock = limits, clock
        self._pings, self._settings = Bucket(limits.pings, now), Bucket(limits.settings, now)
        self._resets = Bucket(limits.resets, now)
        self._glitches = Bucket(limits.glitches, now)
        self.update_credit = 0  # WINDOW_UPDATEs earned and not yet received (``earned_updates``)
        self._server_resets = server_resets  # shared by the server's connections (``GrpcServer``)
        self.empty_in_a_row = 0
        self.continuations = 0

    def ping(self) -> str | None:
        return None if self._pings.take(self.clock()) else "too_many_pings"

    def settings(self) -> str | None:
        return None if self._settings.take(self.clock()) else "too_many_settings"

    def reset(self) -> str | None:
        now = self.clock()
        if not self._resets.take(now) or (self._server_resets is not None and not self._server_resets.take(now)):
            return "too_many_resets"
        return None

    def glitch(self) -> str | None:
        """A frame that changes nothing: PRIORITY, an unknown type, a WINDOW_UPDATE our data did not earn."""
        return None if self._glitches.take(self.clock()) else "too_many_glitches"

    def earned_updates(self) -> None:
        """A DATA frame sent or a stream opened: the WINDOW_UPDATEs a client may send for it (``UPDATES_EARNED``)."""
        self.update_credit = min(MAX_UPDATE_CREDIT, self.update_credit + UPDATES_EARNED)

    def window_update(self) -> str | None:
        """A WINDOW_UPDATE: one of those earned, else a glitch."""
        if self.update_credit > 0:
            self.update_credit -= 1
            return None
        return self.glitch()

    def empty_data(self) -> str | None:
        """A DATA frame with no payload and no END_STREAM; a frame with payload sets ``empty_in_a_row`` to 0."""
        self.empty_in_a_row += 1
        return "too_many_empty_frames" if self.empty_in_a_row > self.limits.empty_data else None

    def continuation(self) -> str | None:
        """A CONTINUATION frame; a HEADERS frame sets ``continuations`` to 0."""
        self.continuations += 1
        return "too_many_continuations" if self.continuations > self.limits.continuations else None


class ByteBudget:
    """Request bytes held in incomplete messages, against a limit: one per connection, one per worker shared by
    its connections (a client that opens many streams and never completes them is refused, not buffered)."""

    __slots__ = ("limit", "used", "peak")

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.peak = limit, 0, 0

    def add(self, delta: int) -> None:
        self.used += delta
        self.peak = max(self.peak, self.used)

    def over(self) -> bool:
        return self.used > self.limit


class StreamBudget:
    """Streams open over a server's connections, against a limit (``H2Connection``'s ``server_streams``): a client
    opening many connections, each with ``MAX_STREAMS`` calls that never finish, would otherwise hold a worker's
    memory without bound."""

    __slots__ = ("limit", "open")

    def __init__(self, limit: int) -> None:
        self.limit, self.open = limit, 0

    def over(self) -> bool:
        return self.open > self.limit


class LogBudget:
    """At most one log line every ``every_s`` for one kind of refusal in this process, counting those left out: a
    client that trips a limit on every stream it opens must not write a line per stream (log flooding); the
    refusals themselves are counted in the node's metrics, every one."""

    __slots__ = ("every_s", "clock", "_last", "_left_out")

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._last: float | None = None
        self._left_out = 0

    def allow(self) -> int | None:
        """None: leave this line out; else log it, with the number left out since the last line."""
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            self._left_out += 1
            return None
        left_out, self._last, self._left_out = self._left_out, now, 0
        return left_out
