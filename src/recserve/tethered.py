"""``python -m recserve.tethered PARENT_PID ARGS...``: ``recserve ARGS...`` that stops with its parent.

Commands that start node servers of their own (``deploy local``, ``bench --target serve-http``, ``plan search
--live``) start them this way (``command``), so a parent killed outright, or whose terminal closed, leaves none
serving.  Linux's parent-death signal sends the node SIGTERM, which it answers as ``kill`` would: it drains and
stops its workers.  The signal is kept across the ``exec`` into
``python -m recserve.cli``.  Elsewhere the node runs untethered."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys

PR_SET_PDEATHSIG = 1
# the line ``recserve serve`` prints once it listens (node/server.py, ``_run_until_signal``), naming its ports
_READY = re.compile(rb"^recserve serve: .* on http://[^\s:]+:(\d+) grpc [^\s:]+:(\d+) ", re.MULTILINE)


def tether(parent_pid: int) -> bool:
    """SIGTERM this process when its parent ends; False when the parent has already ended."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return True
    return os.getppid() == parent_pid  # else it ended before prctl took effect


def command(*args: str) -> list[str]:
    """The argv that runs ``recserve *args`` tethered to this process."""
    return [sys.executable, "-m", "recserve.tethered", str(os.getpid()), *args]


def ready_ports(output: bytes) -> tuple[int, int] | None:
    """The (http, grpc) ports a ``recserve serve`` started on ports 0 bound, from its output's ready line; None
    before that line.  (Ports picked by the parent and bound seconds later, once the child has started, could be
    taken meanwhile by any connection's ephemeral port.)"""
    found = _READY.search(output)
    return None if found is None else (int(found[1]), int(found[2]))


def main(argv: list[str]) -> int:
    if not tether(int(argv[0])):
        return 0
    os.execv(sys.executable, [sys.executable, "-m", "recserve.cli", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
