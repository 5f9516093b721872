"""Waiting in tests for what a node reports asynchronously (workers' counts reach the supervisor within
``STATS_FLUSH_S``, 25 ms, and later on a busy host)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(read: Callable[[], T], done: Callable[[T], bool], timeout_s: float = 60.0) -> T:
    """``read()`` again until ``done`` holds of it, or the last read at ``timeout_s``: the caller asserts on it."""
    deadline, value = time.monotonic() + timeout_s, read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.02)
        value = read()
    return value


def run_until(loop: asyncio.AbstractEventLoop, done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Runs ``loop`` until ``done()`` holds, or ``timeout_s`` (the caller asserts on what it waited for): a loop run
    for a fixed time may not have got there on a busy host."""
    async def wait() -> None:
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    loop.run_until_complete(wait())
