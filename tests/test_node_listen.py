"""A node's listening sockets: a port it cannot take is a one-line error naming it, with nothing left behind."""

from __future__ import annotations

import os
import socket

import pytest

from recserve.errors import RecserveError
from recserve.serving.node.server import listening_socket


def _taken_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_a_taken_port_is_a_recserve_error_naming_it_and_the_socket_is_closed():
    with _taken_port() as holder:
        port = holder.getsockname()[1]
        before = len(os.listdir("/proc/self/fd"))
        for what, flag in (("HTTP", "--http-port"), ("gRPC", "--grpc-port")):
            with pytest.raises(RecserveError, match=f"cannot listen for {what} on 127.0.0.1:{port}: "
                                                    f"Address already in use; .*{flag}"):
                listening_socket("127.0.0.1", port, what)
        assert len(os.listdir("/proc/self/fd")) == before
    with listening_socket("127.0.0.1", 0) as free:
        assert free.getsockname()[1] > 0


@pytest.mark.integration  # starts a node (its workers never start: the gRPC port is refused first)
def test_a_node_whose_grpc_port_is_taken_refuses_to_start_and_lets_its_http_port_go():
    from recserve.serving import NodeServer, config_from_dict
    from tests.support.nodes import generous

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        http_port = probe.getsockname()[1]
    with _taken_port() as holder:
        config = config_from_dict({"host": "127.0.0.1", "http_port": http_port, "grpc_port": holder.getsockname()[1],
                                   "models": [generous({"model": "hercules-rmc1", "scale": 1e-4, "workers": 1})]})
        node = NodeServer(config)
        with pytest.raises(RecserveError, match="cannot listen for gRPC"):
            node.start()
        node.stop()
    with listening_socket("127.0.0.1", http_port):  # the node's HTTP socket was closed with it
        pass
