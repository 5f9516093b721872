"""Shared test fixtures."""

from __future__ import annotations

import contextlib
import os
import tempfile

import pytest
import torch

from tests.support.ports import free_port

torch.set_num_threads(1)


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


@pytest.fixture
def start_node():
    """Starts a node from a config inside a test: ``server = start_node(config)``, ports in ``server.ports``; each
    node it started is stopped when the test ends, passed or failed (``drain=False``: without waiting)."""
    from tests.support.nodes import started

    with contextlib.ExitStack() as stack:
        yield lambda config, drain=True: stack.enter_context(started(config, drain))
