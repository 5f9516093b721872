"""How many bytes the application has read from a TCP socket, from the kernel's own counts (Linux).

A worker marks a connection as holding a request only after its read returns.  If the worker dies in between,
the request's bytes are gone with it while the mark still says idle; the supervisor asks the kernel instead:
bytes received in order (``tcp_info.tcpi_bytes_received``) less those still queued (``FIONREAD``) are the bytes
some process has read.  ``None`` where the kernel does not say (not TCP, an old kernel, a client still sending).
"""

from __future__ import annotations

import array
import fcntl
import socket
import struct
import termios

_BYTES_RECEIVED_AT = 128  # offset of tcpi_bytes_received (__u64) in struct tcp_info (Linux 4.1 on)
_TCP_INFO_BYTES = 256
_TRIES = 4


def _bytes_received(sock: socket.socket) -> int | None:
    info = sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_INFO", 11), _TCP_INFO_BYTES)
    if len(info) < _BYTES_RECEIVED_AT + 8:
        return None
    return int(struct.unpack_from("=Q", info, _BYTES_RECEIVED_AT)[0])


def _queued(sock: socket.socket) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    return int(count[0])


def bytes_read(sock: socket.socket) -> int | None:
    """Bytes of ``sock``'s incoming stream that have been read (by any process holding it), or ``None``.

    The received count is taken before and after the queue length and must not move in between (bytes arriving
    then would count as read); a client that keeps sending through every try gives ``None``."""
    for _ in range(_TRIES):
        try:
            received = _bytes_received(sock)
            if received is None:
                return None
            queued = _queued(sock)
            if _bytes_received(sock) == received:
                return received - queued
        except OSError:
            return None
    return None
