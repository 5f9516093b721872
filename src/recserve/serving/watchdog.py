"""Answer the queries a hung worker holds, from the supervisor, before the worker is replaced.

With data plane v2 a worker owns its clients' connections, so when it stops (SIGSTOP, a deadlock, a
kernel that never returns) nobody else could answer them.  ``pidfd_getfd(2)`` (Linux 5.6+) gives the
supervisor its own copy of each of the worker's TCP connections: one that holds a query (named by the
worker's last heartbeat) or has an unread request waiting in the kernel gets a 504; an idle keep-alive
connection is just closed (clients reconnect, as after any server's idle timeout).  Each is shut down, so
the stuck process can no longer write into it, before the worker is killed and restarted.
Where the syscall is unavailable (older kernel, a seccomp policy) the connections are reset when the worker
dies: the fallback every crashed HTTP server has.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket

log = logging.getLogger("recserve.serving")

SYS_PIDFD_GETFD = {"x86_64": 438, "aarch64": 438}.get(os.uname().machine, 438)
_libc = ctypes.CDLL(None, use_errno=True)


def take_fd(pid: int, fd: int) -> int:
    """Our own descriptor for descriptor ``fd`` of process ``pid``; raises OSError if it cannot be had."""
    pidfd = os.pidfd_open(pid)
    try:
        ours = _libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if ours < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"pidfd_getfd({pid}, {fd}): {os.strerror(err)}")
        return ours
    finally:
        os.close(pidfd)


def socket_fds(pid: int) -> list[int]:
    """Descriptors of process ``pid`` that are sockets (its listening socket and pipes are filtered later)."""
    fds = []
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    fds.append(int(name))
            except OSError:
                continue
    except OSError:
        pass
    return fds


def _is_connection(sock: socket.socket) -> bool:
    return (sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
            and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))


def _read_unread(sock: socket.socket) -> bool:
    """Consume what the client sent that nobody read; True if there was any (a request is waiting).

    Consumed, not peeked: a socket closed with unread data sends a reset, which can make the client drop
    the 504 written just before it."""
    got = False
    while True:
        try:
            chunk = sock.recv(65536, socket.MSG_DONTWAIT)
        except OSError:
            return got
        if not chunk:
            return got
        got = True


def answer_held(pid: int, held: list[int], response: bytes) -> int:
    """Answer ``response`` on each connection of ``pid`` with a query (``held`` or unread), close the others.

    Returns how many were answered."""
    answered = 0
    for fd in socket_fds(pid):
        try:
            sock = socket.socket(fileno=take_fd(pid, fd))
        except OSError as exc:
            log.warning("watchdog: cannot take descriptor %d of pid %d (%s); its connection is reset instead",
                        fd, pid, exc)
            continue
        try:
            if not _is_connection(sock):
                continue
            if _read_unread(sock) or fd in held:
                sock.settimeout(1.0)
                sock.sendall(response)
                answered += 1
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()
    return answered
