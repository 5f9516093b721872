"""Intra-op threads for torch work on threads other than the main one."""

from __future__ import annotations

import torch


def inherit_torch_threads() -> None:
    """Give the calling thread the process's intra-op thread count (``torch.set_num_threads``).

    Why (docs/decisions/2026-11-23-torch-threads-per-thread.md): the count does not reach threads started after it
    was set, so a worker pinned to one core of a many-core host would run one spinning thread per core on that core
    in its compute thread.  Call it first in every thread that runs torch ops (a
    ``ThreadPoolExecutor``'s ``initializer``)."""
    torch.set_num_threads(torch.get_num_threads())
