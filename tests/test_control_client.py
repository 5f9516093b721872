"""The control API's client when the node is not there or is not a node: one clear error, no traceback."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from recserve.cli import main
from recserve.errors import RecserveError
from recserve.serving.node.control_client import ControlClient, NodeUnreachableError


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _answering(status: int, body: bytes) -> Iterator[int]:
    """A stand-in HTTP server that answers every GET ``status`` with ``body``; its port."""
    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_node_that_is_not_there_is_unreachable_and_still_an_os_error():
    port = _closed_port()
    with pytest.raises(NodeUnreachableError, match=rf"cannot reach a node at http://127.0.0.1:{port} \(.*refused"):
        ControlClient("127.0.0.1", port, timeout_s=10).models()
    assert issubclass(NodeUnreachableError, OSError)  # callers waiting for a node to come up catch OSError


def test_a_server_that_is_not_a_node_is_named_as_such():
    with _answering(200, b"<html>hello</html>") as port:
        with pytest.raises(RecserveError, match="/control/models answered 18 bytes that are not JSON; is it a "):
            ControlClient("127.0.0.1", port, timeout_s=10).models()


def test_a_listener_that_does_not_speak_http_is_unreachable():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def answer_garbage() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"SSH-2.0-not-http\r\n")

        threading.Thread(target=answer_garbage, daemon=True).start()
        with pytest.raises(NodeUnreachableError, match="cannot reach a node"):
            ControlClient("127.0.0.1", listener.getsockname()[1], timeout_s=10).models()


def test_models_list_against_no_node_is_one_line(capsys):
    port = _closed_port()
    assert main(["models", "list", "--server", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"recserve: error: cannot reach a node at http://127.0.0.1:{port}") and "Traceback" not in err


def test_a_refused_token_says_where_this_client_reads_it(monkeypatch):
    monkeypatch.delenv("RECSERVE_CONTROL_TOKEN", raising=False)
    with _answering(401, b'{"error": "Authorization: the control API needs \'Bearer <token>\'"}') as port:
        with pytest.raises(RecserveError, match="HTTP 401: .*needs 'Bearer <token>' \\(this client sends the token "
                                                "in RECSERVE_CONTROL_TOKEN"):
            ControlClient("127.0.0.1", port, timeout_s=10).models()
