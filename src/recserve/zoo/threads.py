"""Intra-op threads for torch work on threads other than the main one."""

from __future__ import annotations

import torch


def inherit_torch_threads() -> None:
    """Give the calling thread the process's intra-op thread count (``torch.set_num_threads``).

    Why: the count does not reach threads started after it was set.  Measured: with ``set_num_threads(1)`` in the
    main thread, a GEMM on a new thread ran on every core (CPU/wall 2.0 on 2 cores).  A node worker pinned to one
    core of a 16-core host then ran 16 spinning threads on that core in its compute thread: recserve with one
    worker met the SLA at 7.8 QPS there instead of 112.  Call it first in every thread that runs torch ops (a
    ``ThreadPoolExecutor``'s ``initializer``)."""
    torch.set_num_threads(torch.get_num_threads())
