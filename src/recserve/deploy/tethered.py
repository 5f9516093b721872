"""``python -m recserve.deploy.tethered PARENT_PID ARGS...``: ``recserve ARGS...`` that stops with its parent.

``deploy local`` starts each node server this way.  The nodes run in sessions of their own (a terminal's Ctrl-C
reaches ``deploy local`` only, which stops them in turn), so without this a ``deploy local`` killed outright, or
whose terminal closed, would leave them serving.  Linux's parent-death signal sends the node SIGTERM, which it
answers as ``kill`` would: it drains and stops its workers.  The signal is kept across the ``exec`` into
``python -m recserve.cli``.  Elsewhere the node runs untethered."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def tether(parent_pid: int) -> bool:
    """SIGTERM this process when its parent ends; False when the parent has already ended."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return True
    return os.getppid() == parent_pid  # else it ended before prctl took effect


def main(argv: list[str]) -> int:
    if not tether(int(argv[0])):
        return 0
    os.execv(sys.executable, [sys.executable, "-m", "recserve.cli", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
