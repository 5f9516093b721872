"""Live settings sent to a model's workers, each change numbered and acknowledged (``pipe.Config.seq`` answered by
``pipe.Applied``), so that whoever changes a setting knows when it is in effect: a control call's answer, a
retiree that must stop accepting before any retiree closes a connection."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from recserve.serving.node.handle import WorkerHandle
from recserve.serving.wire import pipe
from recserve.serving.wire.errors import InferError

APPLY_TIMEOUT_S = 10.0  # how long a change waits for every working worker to apply it


class LiveSettings:
    """Numbers the changes sent to one model's workers and waits for their acknowledgements."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.seq = 0

    async def apply(self, workers: list[WorkerHandle], changes: dict[str, Any],
                    timeout_s: float = APPLY_TIMEOUT_S) -> None:
        """Send ``changes`` to ``workers``; return once every working one has applied them.  A worker that exits or
        hangs meanwhile is not waited for (a replacement starts with the settings).  ``InferError``
        ("unavailable") past ``timeout_s``."""
        self.seq += 1
        seq = self.seq
        message = pipe.encode(pipe.Config(changes, seq))
        for w in workers:
            w.outbox.post(message)  # type: ignore[union-attr]

        def behind() -> list[WorkerHandle]:
            return [w for w in workers if w.working and not w.exited.done() and w.config_seq < seq]

        deadline = time.monotonic() + timeout_s
        while behind():
            if time.monotonic() >= deadline:
                raise InferError("unavailable", f"model {self.model!r}: {len(behind())} worker(s) have not applied "
                                 f"{sorted(changes)} within {timeout_s:g} s; they will when their loop next runs",
                                 sorted(changes)[0])
            await asyncio.sleep(0.002)
