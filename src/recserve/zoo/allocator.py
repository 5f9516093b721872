"""glibc's allocator set to keep freed memory for the next forward pass: the environment of the serving workers.

Why (docs/decisions/2026-11-28-glibc-heap-tunables.md): glibc serves every allocation above its mmap threshold
(at most 32 MiB) with a fresh ``mmap`` and unmaps it on ``free``, so a model whose activations pass that size
faults every page of them in again on every call.  Hence the threshold raised, trimming off and one arena (a second
thread otherwise gets its own arena, whose 64 MiB heaps cannot hold such blocks and fall back to ``mmap``), for a
little more peak RSS.  PyTorch servers usually get this by preloading
jemalloc or tcmalloc; glibc's tunables give it with no native dependency.  They are read when a process starts, so
they go in the environment the workers' forkserver starts with (``serving.node.forkserver.WorkerContext``); a C library
other than glibc ignores them.
"""

from __future__ import annotations

WORKER_TUNABLES = {
    "glibc.malloc.mmap_threshold": str(1 << 30),  # blocks up to 1 GiB come from the heap and go back to it
    "glibc.malloc.trim_threshold": str(2**31 - 1),  # free memory at the top of the heap stays mapped
    "glibc.malloc.arena_max": "1",  # the compute thread allocates from the main heap too
}


def worker_tunables(existing: str = "") -> str:
    """``GLIBC_TUNABLES`` for a worker: ``existing`` (the user's, which win) plus the settings above."""
    given = {item.split("=", 1)[0] for item in existing.split(":") if "=" in item}
    ours = [f"{key}={value}" for key, value in WORKER_TUNABLES.items() if key not in given]
    return ":".join([part for part in existing.split(":") if part] + ours)


def release_free_memory() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``): with the settings above nothing is
    ever returned on its own, so a worker calls this, rarely, once a client's large input has been let go.
    False where the C library has no such call (it is glibc's)."""
    import ctypes

    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False
