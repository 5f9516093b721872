"""``bench`` against a server that accepts connections and never answers ends in about duration + timeout."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from recserve.cli import main

pytestmark = pytest.mark.integration  # starts a server


class SilentServer:
    """Accepts TCP connections on a free loopback port and never reads or answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.first_accept: float | None = None  # time.monotonic() of the first connection
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
                if self.first_accept is None:
                    self.first_accept = time.monotonic()
            except OSError:
                return

    def __enter__(self) -> SilentServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()
        self.thread.join(timeout=5)


def test_the_first_warm_up_timeout_ends_the_warm_up_with_a_line_naming_target_and_timeout(capsys):
    with SilentServer() as server:
        code = main(["bench", "--model", "hercules-rmc1", "--target", f"http://127.0.0.1:{server.port}",
                     "--rate", "5", "--duration", "1", "--timeout-ms", "1000", "--quiet"])
        # from the first query on: the set-up before it (seconds of imports and pool building) is the host's pace
        elapsed = time.monotonic() - server.first_accept
    err = capsys.readouterr().err
    assert code == 1 and "no query was answered" in err
    assert f"warm-up ended: no answer from http http://127.0.0.1:{server.port}" in err and "within 1 s" in err
    assert elapsed < 20.0  # the 32 pooled queries one by one would wait 32 s
