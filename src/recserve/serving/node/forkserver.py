"""The workers' forkserver: torch imported once, workers forked from it without re-running the parent's ``__main__``."""

from __future__ import annotations

import multiprocessing
import os
import threading
from multiprocessing import popen_forkserver, spawn
from multiprocessing.context import ForkServerProcess
from typing import Any

_PREP_LOCK = threading.Lock()


class _NoMainPopen(popen_forkserver.Popen):
    """Forkserver launch that does not re-import the parent's ``__main__`` in the worker.

    Workers only run :func:`worker_main`, so scripts and REPLs that start a NodeServer need no
    ``if __name__ == "__main__"`` guard.
    """

    def _launch(self, process_obj: Any) -> None:
        with _PREP_LOCK:
            original = spawn.get_preparation_data

            def prep(name: str) -> dict:
                data = original(name)
                data.pop("init_main_from_path", None)
                data.pop("init_main_from_name", None)
                return data

            spawn.get_preparation_data = prep
            try:
                super()._launch(process_obj)
            finally:
                spawn.get_preparation_data = original


class WorkerProcess(ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _NoMainPopen:  # noqa: N802 (multiprocessing's name)
        return _NoMainPopen(process_obj)


class WorkerContext:
    """Forkserver with torch preloaded: fast, thread-safe worker starts that can receive shared tensors."""

    def __init__(self) -> None:
        import torch.multiprocessing  # noqa: F401  registers the reductions that share tensors by fd

        from recserve.zoo.allocator import worker_tunables

        # read by glibc when the forkserver starts (the first worker's start): the workers reuse freed activations
        os.environ["GLIBC_TUNABLES"] = worker_tunables(os.environ.get("GLIBC_TUNABLES", ""))
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["recserve.serving.worker.main"])
        self.Process = WorkerProcess

    def Pipe(self, duplex: bool = True) -> tuple[Any, Any]:  # noqa: N802
        return self.ctx.Pipe(duplex)


def mp_context() -> WorkerContext:
    return WorkerContext()
