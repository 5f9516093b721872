"""How many bytes of a TCP connection have been read and written by the processes holding it (Linux), from the
kernel's own counts.

A worker publishes what it has read and written when it marks a connection, but it can die between a read or a
write and its next mark.  The supervisor then asks the kernel: bytes received in order less those still queued
(``tcpi_bytes_received`` - ``FIONREAD``) have been read, bytes the peer acknowledged plus those still queued to
send (``tcpi_bytes_acked`` + ``TIOCOUTQ``) have been written.  ``None`` where the kernel does not say (not TCP,
an old kernel, counts that keep moving).
"""

from __future__ import annotations

import array
import fcntl
import socket
import struct
import termios
from typing import NamedTuple

_TCP_INFO = getattr(socket, "TCP_INFO", 11)
_ACKED_AT, _RECEIVED_AT = 120, 128  # tcpi_bytes_acked, tcpi_bytes_received (__u64) in struct tcp_info (Linux 4.1+)
_TCP_INFO_BYTES = 256
_TRIES = 4


class StreamCounts(NamedTuple):
    read: int  # bytes of the incoming stream taken from the socket
    written: int  # bytes of the outgoing stream given to the socket (acknowledged by the peer, or queued)


def _acked_received(sock: socket.socket) -> tuple[int, int] | None:
    info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_BYTES)
    if len(info) < _RECEIVED_AT + 8:
        return None
    return struct.unpack_from("=QQ", info, _ACKED_AT)


def _queued(sock: socket.socket, request: int) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), request, count)
    return int(count[0])


def stream_counts(sock: socket.socket) -> StreamCounts | None:
    """``sock``'s bytes read and written so far, or ``None``.

    The kernel's totals are taken before and after the queue lengths and must not move in between (a byte
    arriving, or an acknowledgement, would be counted twice or not at all); counts that move through every try
    give ``None``."""
    for _ in range(_TRIES):
        try:
            totals = _acked_received(sock)
            if totals is None:
                return None
            unread, unsent = _queued(sock, termios.FIONREAD), _queued(sock, termios.TIOCOUTQ)
            if _acked_received(sock) == totals:
                acked, received = totals
                return StreamCounts(received - unread, acked + unsent)
        except OSError:
            return None
    return None
