"""The log lines of a node's processes (``recserve serve`` and its workers): one line per event, and a bounded
number of them however often an event repeats.

- :class:`OneLineFormatter` escapes line breaks and other control characters in a message: a name a client chose
  (a model to load, a region, a path) cannot end the line and start a forged one.  A traceback keeps its lines:
  it is a bug's, written once by the code that caught it.
- :class:`RepeatLimit` lets each call site (logger, level, file, line) write a burst of lines, then one a second;
  the next line it lets through says how many it dropped.  A client repeating a request that logs (a failing
  load, say) cannot flood the log, while the events of a busy moment (every model of a node starting) still show.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


class OneLineFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose message is one line: control characters written as escapes."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = record.message.translate(CONTROL)
        return super().formatMessage(record)


class RepeatLimit(logging.Filter):
    """At most ``burst`` lines per call site at once, then ``per_s`` a second (a token bucket per site); the next
    line let through after some were dropped says how many."""

    def __init__(self, burst: int = 50, per_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.per_s, self.clock = burst, per_s, clock
        self._sites: dict[tuple[str, int, str, int], list[float]] = {}  # site -> [tokens, last refill, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        site = self._sites.setdefault((record.name, record.levelno, record.pathname, record.lineno),
                                      [float(self.burst), now, 0])
        site[0] = min(self.burst, site[0] + (now - site[1]) * self.per_s)
        site[1] = now
        if site[0] < 1:
            site[2] += 1
            return False
        site[0] -= 1
        if site[2] and isinstance(record.msg, str):
            record.msg += f" [{int(site[2])} more lines from here dropped before this one]"
            site[2] = 0
        return True


def log_to_stderr(level: int, fmt: str) -> None:
    """Lines at ``level`` and above to stderr in ``fmt``, one line per event and repeats limited; nothing changes
    where the process's logging is already set up (a test's capture, an embedding application)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(fmt))
    handler.addFilter(RepeatLimit())
    root.addHandler(handler)
    root.setLevel(level)
