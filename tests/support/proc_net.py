"""Which process holds a TCP connection, read from /proc (the tests' view of where the node serves a client)."""

from __future__ import annotations

import os
from collections.abc import Callable


def tcp_inodes(match: Callable[[int, int, str], bool]) -> set[str]:
    """``socket:[inode]`` of each /proc/net/tcp entry whose (local port, remote port, state hex) ``match``."""
    found = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote = (int(fields[i].split(":")[1], 16) for i in (1, 2))
            if match(local, remote, fields[3]):
                found.add(f"socket:[{fields[9]}]")
    return found


def holder(inodes: set[str], pids: list[int]) -> int | None:
    """The first of ``pids`` holding a descriptor of one of the sockets ``inodes``."""
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return pid
            except OSError:
                continue
    return None
