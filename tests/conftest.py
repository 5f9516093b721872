"""Shared test fixtures."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest
import torch

torch.set_num_threads(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def disk_dir():
    """A temp dir on a real disk (O_DIRECT works there; /tmp may be tmpfs elsewhere)."""
    base = os.path.join(os.path.dirname(__file__), "..", ".pytest_tmp_sdm")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        yield d
