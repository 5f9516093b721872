"""One open-loop schedule sent from N generator processes, so one event loop's CPU is not the limit.

**Dealing, not N independent streams.**  The schedule is drawn once, as for one process, and dealt
round-robin (query ``k`` to process ``k mod N``).  N independent Poisson streams at rate/N would
also superpose to a Poisson stream, but dealing keeps the union *exactly* the schedule one process
would send for the same seed (same arrival times, same queries), so ``procs=1`` and ``procs=N`` runs
are comparable query for query, and merging puts every scheduled query back in its place once.
(Each process alone sends every N-th arrival, an Erlang-N renewal stream; the server sees the sum.)

**Start barrier.**  Every process receives its part and answers *armed*; only then are all given
the same absolute start time on ``time.monotonic()`` (CLOCK_MONOTONIC, shared by the processes of
one host and read by asyncio's ``loop.time()``) a little in the future, so they count from one clock.

Processes are spawned (the caller has threads: forking would copy held locks) once per
:class:`~recserve.measure.loadgen.LoadSession`; each prepares its own copy of the target (its own
connections) and keeps it across runs.  The in-flight cap is split evenly between processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from recserve.errors import RecserveError
from recserve.measure.loadgen import Drive, deal, drive, merge, warm_up
from recserve.measure.requests import RequestPool
from recserve.measure.targets import InProcessTarget, Target

START_MARGIN_S = 0.05  # from sending the start time to the start: covers waking N processes
READY_TIMEOUT_S = 180.0  # spawn + imports + prepare on a busy host


def _generator_main(conn: Connection, target: Target, pool: RequestPool, warm: bool) -> None:
    """One generator process: prepare, then ``run`` messages until ``close`` (or the parent is gone)."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(target.prepare(pool))
        if warm:
            loop.run_until_complete(warm_up(target, len(pool)))
        conn.send(("ready", None))
        while (msg := conn.recv())[0] == "run":
            _, times, choice, max_inflight, timeout_s, spin_s = msg
            conn.send(("armed", None))
            start_at = conn.recv()
            conn.send(("done", loop.run_until_complete(drive(target, times, choice, max_inflight, timeout_s,
                                                             start_at=start_at, spin_s=spin_s))))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the session is gone: just stop
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        loop.run_until_complete(target.close())
        loop.close()


class GeneratorProcesses:
    """``procs`` spawned generator processes driving copies of one (network) target."""

    def __init__(self, target: Target, pool: RequestPool, procs: int, warm: bool = False) -> None:
        if isinstance(target, InProcessTarget):
            raise RecserveError("procs > 1 needs a network target (http/grpc): an in-process target would start "
                                "one worker pool per generator process")
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        try:
            for j in range(procs):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=_generator_main, args=(theirs, target, pool.recipe(), warm),
                                   name=f"recserve-loadgen-{j}", daemon=True)
                proc.start()
                theirs.close()
                self._conns.append(mine)
                self._procs.append(proc)
            self._gather("ready", time.monotonic() + READY_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self._conns)

    def _gather(self, expected: str, deadline: float) -> list[Any]:
        """One ``expected`` answer from every process (in order), or a clear error."""
        out = []
        for j, conn in enumerate(self._conns):
            try:
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise RecserveError(f"generator process {j} did not answer {expected!r} in time")
                kind, value = conn.recv()
            except (EOFError, OSError) as exc:
                raise RecserveError(f"generator process {j} died (exit code {self._procs[j].exitcode})") from exc
            if kind != expected:
                raise RecserveError(f"generator process {j} failed: {value}")
            out.append(value)
        return out

    def run(self, times: np.ndarray, choice: np.ndarray, max_inflight: int, timeout_s: float,
            spin_s: float = 0.0) -> Drive:
        """Deal the schedule, start every process on one clock, merge what they saw."""
        cap = max(1, -(-max_inflight // len(self)))
        for conn, (t, c) in zip(self._conns, deal(times, choice, len(self)), strict=True):
            conn.send(("run", t, c, cap, timeout_s, spin_s))
        self._gather("armed", time.monotonic() + 60.0)
        start_at = time.monotonic() + START_MARGIN_S
        for conn in self._conns:
            conn.send(start_at)
        deadline = start_at + float(times[-1] if times.size else 0.0) + timeout_s + 60.0
        return merge(self._gather("done", deadline))

    def close(self) -> None:
        """Ask every process to stop, then make sure it has (terminate after a grace period)."""
        for conn in self._conns:
            try:
                conn.send(("close",))
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
