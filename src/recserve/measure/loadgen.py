"""Open-loop load generator: Poisson arrivals at a fixed rate, latency counted from the schedule.

Every query has a *scheduled* send time drawn before the run (exponential gaps, seeded).  Its
latency is ``completion − scheduled``, never ``completion − actual send``: if the server (or this
generator) falls behind, the wait is charged to the queries that suffered it, so a slow server
cannot hide its queueing (no coordinated omission).  In-flight queries are capped; a query that
arrives while the cap is reached is not sent and counts as ``dropped``.  Failures are counted by
kind (``http_503``, ``grpc_UNAVAILABLE``, ``timeout``, ``dropped`` …) and, for SLA purposes, count
as infinitely slow.

The generator measures itself, so a run can show it was not the bottleneck: *send lag* (when each
query was actually dispatched minus when it was scheduled) and its CPU use.  ``procs=N`` spreads
the schedule over N generator processes (:mod:`recserve.measure.spread`) when one event loop is
not enough.

Use :func:`run_load` for one run, or :class:`LoadSession` to keep one target (connection pool,
worker processes) across many runs, e.g. inside a max-load search.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recserve.errors import RecserveError
from recserve.measure.requests import RequestPool, arrival_times
from recserve.measure.targets import RequestFailed, Target


@dataclass
class LoadResult:
    """What one open-loop run at ``offered_qps`` measured (latencies in ms from the scheduled time)."""

    target: str
    offered_qps: float
    duration_s: float
    elapsed_s: float
    sent: int
    latencies_ms: np.ndarray
    errors: dict[str, int]
    send_lag_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mean_size: float = 0.0
    measured: int = 0
    procs: int = 1
    run_s: float = 0.0
    """Wall time of the whole run, warm-up included: from the common start to the last completion."""
    cpu_s: float = 0.0
    """CPU seconds (user + system, all threads) of the processes the generator ran in, summed.  With
    ``procs=1`` that is the calling process, so it also counts anything else that process runs (an
    in-process target or server); ``loop_cpu_s`` is the generator's event loop(s) alone."""
    loop_cpu_s: float = 0.0
    refused_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Time to the server's error answer, for queries it refused (503, 504, ...): how fast shedding is."""
    refusal_reasons: dict[str, int] = field(default_factory=dict)
    """The server's error messages, numbers as ``N`` and advice cut (``refusal_reason``), and how many had each."""

    @property
    def ok(self) -> int:
        return int(self.latencies_ms.size)

    @property
    def failed(self) -> int:
        return int(sum(self.errors.values()))

    @property
    def achieved_qps(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile(self, p: float, failures_as_inf: bool = True) -> float:
        """The ``p``-th percentile latency; failed queries count as infinitely slow unless told otherwise."""
        lat = self.latencies_ms
        if failures_as_inf and self.failed:
            lat = np.concatenate([lat, np.full(self.failed, np.inf)])
        if lat.size == 0:
            return float("inf")
        return float(np.percentile(lat, p, method="higher"))

    @property
    def p50(self) -> float:
        return self.percentile(50)

    def send_lag(self, p: float) -> float:
        """The ``p``-th percentile send lag (ms; 100 = max): how late the generator dispatched queries."""
        lag = self.send_lag_ms
        return float(np.percentile(lag, p, method="higher")) if lag.size else float("nan")

    @property
    def cpu_per_s(self) -> float:
        """Generator CPU seconds per second of run (1.0 = one core busy)."""
        return self.cpu_s / self.run_s if self.run_s > 0 else 0.0

    @property
    def p95(self) -> float:
        return self.percentile(95)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    def summary(self) -> str:
        errs = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())) or "none"
        return (f"offered {self.offered_qps:.1f} qps, achieved {self.achieved_qps:.1f} qps over {self.elapsed_s:.1f}s; "
                f"latency p50 {self.p50:.2f} ms, p95 {self.p95:.2f} ms, p99 {self.p99:.2f} ms; "
                f"{self.ok}/{self.measured} ok; errors: {errs}; send lag p50 {self.send_lag(50):.2f} / "
                f"p99 {self.send_lag(99):.2f} / max {self.send_lag(100):.2f} ms; generator CPU "
                f"{self.cpu_per_s:.2f} s/s on {self.procs} process{'es' if self.procs > 1 else ''}")

    def to_dict(self) -> dict[str, Any]:
        ok_lat = self.latencies_ms
        return {
            "target": self.target,
            "offered_qps": self.offered_qps,
            "achieved_qps": self.achieved_qps,
            "duration_s": self.duration_s,
            "elapsed_s": self.elapsed_s,
            "sent": self.sent,
            "measured": self.measured,
            "ok": self.ok,
            "errors": dict(self.errors),
            "mean_query_size": self.mean_size,
            "latency_ms": {
                "p50": _finite(self.p50), "p95": _finite(self.p95), "p99": _finite(self.p99),
                "mean_ok": float(ok_lat.mean()) if ok_lat.size else None,
                "max_ok": float(ok_lat.max()) if ok_lat.size else None,
            },
            "refused_answer_ms": {"p50": _pct(self.refused_ms, 50), "p99": _pct(self.refused_ms, 99)},
            "refusal_reasons": dict(Counter(self.refusal_reasons).most_common(REASONS_KEPT)),
            "send_lag_ms_p99": _finite(self.send_lag(99)),
            "send_lag_ms": {"p50": _finite(self.send_lag(50)), "p99": _finite(self.send_lag(99)),
                            "max": _finite(self.send_lag(100))},
            "generator": {"procs": self.procs, "run_s": self.run_s, "cpu_s": self.cpu_s,
                          "cpu_per_s": self.cpu_per_s, "loop_cpu_s": self.loop_cpu_s},
        }


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a run: ``result`` holds the queries that completed before it (None if none did),
    ``signal`` the interrupt itself, to raise again once the result is saved."""

    def __init__(self, result: LoadResult | None, signal: KeyboardInterrupt) -> None:
        super().__init__()
        self.result, self.signal = result, signal


REASONS_KEPT = 8  # distinct refusal messages a run's record keeps (the most frequent)


def refusal_reason(detail: str) -> str:
    """A server's error message as a class: its JSON wrapper off, cut at its first ``;`` or sentence end (recserve's
    advice follows), numbers as ``N``: "model 'rmc1' is overloaded: N queries queued at this worker (limit N)"."""
    text = re.split(r';|\.\s|"\s*[,}]', re.sub(r'^\{\s*"error"\s*:\s*"', "", detail), maxsplit=1)[0]
    return re.sub(r"(?<![A-Za-z_\d.])\d+(?:\.\d+)?", "N", text)[:160]  # not the digits of a name (rmc1)


async def _cancel_others() -> None:
    """Cancel every other task of the running loop and wait for them."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None


class _Progress:
    """One self-overwriting status line on a terminal's stderr, at most every ``every`` seconds; on a stderr that
    is not a terminal (a log file), a plain line at most every ``log_every`` seconds, without control codes."""

    def __init__(self, enabled: bool, label: str, every: float = 0.5, log_every: float = 5.0) -> None:
        self.tty = sys.stderr.isatty()
        self.enabled, self.label = enabled, label
        self.every = every if self.tty else log_every
        self._last = 0.0 if self.tty else time.monotonic()

    def update(self, text: Callable[[], str], force: bool = False) -> None:
        """``text`` is only called when a line is due, so the hot loop pays for a clock read only."""
        now = time.monotonic()
        if self.enabled and (force or now - self._last >= self.every):
            self._last = now
            if self.tty:
                print(f"\r{self.label} {text()}\033[K", end="", file=sys.stderr, flush=True)
            else:
                print(f"{self.label} {text()}", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr, flush=True)


@dataclass
class Drive:
    """What one generator event loop saw, per query of the schedule it was given (in its order)."""

    latency_ms: np.ndarray  # from the scheduled time; NaN when the query failed
    kinds: list[str | None]  # failure kind, None when ok
    lag_ms: np.ndarray  # dispatch time - scheduled time
    last_s: float  # last completion, seconds from the start
    cpu_s: float  # process CPU seconds over the run (all threads)
    loop_cpu_s: float  # the event-loop thread's CPU seconds over the run
    refused_ms: np.ndarray | None = None  # from the scheduled time to the server's error answer; NaN otherwise
    reasons: list[str | None] | None = None  # the server's error message (``refusal_reason``), None otherwise


def deal(times: np.ndarray, choice: np.ndarray, procs: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Deal the schedule round-robin: query ``k`` goes to part ``k % procs``."""
    return [(times[j::procs], choice[j::procs]) for j in range(procs)]


def merge(parts: list[Drive]) -> Drive:
    """Undo :func:`deal`: every scheduled query back at its place, counted once; CPU summed."""
    n, procs = sum(p.lag_ms.size for p in parts), len(parts)
    latency, lag, kinds, refused = np.empty(n), np.empty(n), [None] * n, np.full(n, np.nan)
    reasons: list[str | None] = [None] * n
    for j, part in enumerate(parts):
        latency[j::procs], lag[j::procs], kinds[j::procs] = part.latency_ms, part.lag_ms, part.kinds
        if part.refused_ms is not None:
            refused[j::procs] = part.refused_ms
        if part.reasons is not None:
            reasons[j::procs] = part.reasons
    return Drive(latency, kinds, lag, max((p.last_s for p in parts), default=0.0),
                 sum(p.cpu_s for p in parts), sum(p.loop_cpu_s for p in parts), refused, reasons)


def _pct(values: np.ndarray, p: float) -> float | None:
    return float(np.percentile(values, p)) if values.size else None


def _answered(refused_ms: np.ndarray | None, keep: np.ndarray) -> np.ndarray:
    if refused_ms is None:
        return np.zeros(0)
    kept = refused_ms[keep]
    return kept[~np.isnan(kept)]


@dataclass
class _Record:
    """Per query of a schedule, what :func:`drive` saw so far (the arrays a :class:`Drive` is made of), with its
    counters (``state``: in flight, done, failed, last completion, sent) and the CPU clocks at its start."""

    latency: np.ndarray
    refused: np.ndarray
    kinds: list[str | None]
    reasons: list[str | None]
    lag: np.ndarray
    state: dict
    cpu0: float
    loop_cpu0: float

    @classmethod
    def empty(cls, n: int) -> _Record:
        return cls(np.full(n, np.nan), np.full(n, np.nan), [None] * n, [None] * n, np.zeros(n),
                   {"inflight": 0, "done": 0, "failed": 0, "last": 0.0, "sent": 0},
                   time.process_time(), time.thread_time())

    def snapshot(self) -> tuple[np.ndarray, Drive]:
        """The queries completed so far: their indices and a Drive of them."""
        latency, kinds, reasons = self.latency, self.kinds, self.reasons
        idx = np.array([k for k in range(self.state["sent"]) if kinds[k] is not None or not np.isnan(latency[k])],
                       int)
        return idx, Drive(latency[idx], [kinds[k] for k in idx], self.lag[idx], self.state["last"],
                          time.process_time() - self.cpu0, time.thread_time() - self.loop_cpu0, self.refused[idx],
                          [reasons[k] for k in idx])

    def result(self) -> Drive:
        return Drive(self.latency, self.kinds, self.lag, self.state["last"], time.process_time() - self.cpu0,
                     time.thread_time() - self.loop_cpu0, self.refused, self.reasons)


async def drive(target: Target, times: np.ndarray, choice: np.ndarray, max_inflight: int, timeout_s: float,
                progress: _Progress | None = None, start_at: float | None = None, spin_s: float = 0.0,
                snapshots: list[Callable[[], tuple[np.ndarray, Drive]]] | None = None) -> Drive:
    """Send query ``choice[k]`` at ``times[k]`` (s from the start: ``start_at`` on the loop's clock,
    ``time.monotonic()``, which processes on one host share; default 5 ms from now).  ``spin_s``: see
    :func:`until`.  ``snapshots`` gets a function returning the queries completed so far (their indices and a
    Drive of them), for a run that is interrupted."""
    loop = asyncio.get_running_loop()
    record = _Record.empty(len(times))
    start = loop.time() + 0.005 if start_at is None else start_at
    if snapshots is not None:
        snapshots.append(record.snapshot)
    tasks: set[asyncio.Task] = set()
    one = _query_sender(target, times, choice, timeout_s, loop, start, record)
    await _send_schedule(times, max_inflight, progress, spin_s, loop, start, record, one, tasks)
    await _drain(tasks, progress, len(times), record.state, loop, start)
    return record.result()


def _query_sender(target: Target, times: np.ndarray, choice: np.ndarray, timeout_s: float,
                  loop: asyncio.AbstractEventLoop, start: float, record: _Record) -> Callable[[int], Awaitable[None]]:
    """The coroutine that sends query ``k`` and records how it ended (its latency from the scheduled time, or its
    failure's kind, with the server's reason where the server refused it)."""
    latency, refused, kinds, reasons, state = record.latency, record.refused, record.kinds, record.reasons, record.state

    async def one(k: int) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                await target.infer(int(choice[k]))
            latency[k] = (loop.time() - start - times[k]) * 1000.0
        except RequestFailed as exc:
            kinds[k] = exc.kind
            refused[k] = (loop.time() - start - times[k]) * 1000.0
            if exc.detail and exc.kind.startswith(("http_", "grpc_")):  # the server's answer, not a client failure
                reasons[k] = refusal_reason(exc.detail)
        except TimeoutError:
            kinds[k] = "timeout"
        except Exception as exc:  # any other client-side failure is still one failed query
            kinds[k] = f"exception_{type(exc).__name__}"
        finally:
            state["failed"] += kinds[k] is not None
            state["inflight"] -= 1
            state["done"] += 1
            state["last"] = loop.time() - start

    return one


async def _send_schedule(times: np.ndarray, max_inflight: int, progress: _Progress | None, spin_s: float,
                         loop: asyncio.AbstractEventLoop, start: float, record: _Record,
                         one: Callable[[int], Awaitable[None]], tasks: set[asyncio.Task]) -> None:
    """Each query at its time (a task of ``one``, kept in ``tasks``), or dropped with ``max_inflight`` in flight;
    behind schedule, the loop still yields every 32 sends so that responses come in."""
    n, lag, kinds, state = len(times), record.lag, record.kinds, record.state
    unyielded = 0
    waker = ExactWaker.open(loop) if spin_s <= 0 else None
    for k in range(n):
        if start + times[k] > loop.time():
            await (waker.until(start + times[k]) if waker is not None else until(loop, start + times[k], spin_s))
            unyielded = 0
        elif (unyielded := unyielded + 1) >= 32:
            await asyncio.sleep(0)  # behind schedule: still let responses in
            unyielded = 0
        lag[k] = (loop.time() - start - times[k]) * 1000.0
        state["sent"] = k + 1
        if state["inflight"] >= max_inflight:
            kinds[k] = "dropped"
            state["done"] += 1
            state["failed"] += 1
        else:
            state["inflight"] += 1
            task = asyncio.create_task(one(k))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if progress is not None:
            progress.update(lambda k=k: _status(k + 1, n, state, times[k]))
    if waker is not None:
        waker.close()


async def _drain(tasks: set[asyncio.Task], progress: _Progress | None, n: int, state: dict,
                 loop: asyncio.AbstractEventLoop, start: float) -> None:
    """Wait for the queries still in flight, the status line kept current."""
    while tasks:
        await asyncio.wait(set(tasks), timeout=0.5)
        if progress is not None:
            progress.update(lambda: _status(n, n, state, loop.time() - start))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class ExactWaker:
    """Wake the generator's loop at a send time to the microsecond, without spinning: a Linux ``timerfd`` armed
    for the absolute ``CLOCK_MONOTONIC`` time (the loop's clock) and watched by the loop like a socket.

    Why: asyncio's timers wake up to 1 ms late (epoll rounds its timeout up to whole ms), which alone put the
    send-lag p99 at ~1.1 ms whatever the rate; spinning the last ms costs a core."""

    CLOCK_MONOTONIC, TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 1, 0o4000, 0o2000000, 1

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: ctypes.CDLL, fd: int) -> None:
        self.loop, self._libc, self.fd = loop, libc, fd
        self._waiter: asyncio.Future[None] | None = None
        loop.add_reader(fd, self._fired)

    @classmethod
    def open(cls, loop: asyncio.AbstractEventLoop) -> ExactWaker | None:
        """A waker, or None where timerfd is unavailable (then the loop's own timers are used)."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(cls.CLOCK_MONOTONIC, cls.TFD_NONBLOCK | cls.TFD_CLOEXEC)
        except (OSError, AttributeError):
            return None
        return cls(loop, libc, fd) if fd >= 0 else None

    async def until(self, when: float) -> None:
        sec = int(when)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, max(1, int((when - sec) * 1e9))))
        if self._libc.timerfd_settime(self.fd, self.TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            await until(self.loop, when)
            return
        self._waiter = self.loop.create_future()
        await self._waiter

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        os.close(self.fd)


async def until(loop: asyncio.AbstractEventLoop, when: float, spin_s: float = 0.0) -> None:
    """Return at loop time ``when``.  The loop's timer wakes up to 1 ms late (epoll rounds its timeout
    up to whole ms), so the last ``spin_s`` are spent yielding to the loop instead: on time, but that
    core stays busy while waiting."""
    if when - loop.time() > spin_s:
        await asyncio.sleep(when - loop.time() - spin_s)
    while loop.time() < when:
        await asyncio.sleep(0)


def _warm_up_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def warm_up(target: Target, n: int, log: Callable[[str], None] = _warm_up_log) -> bool:
    """Send pooled queries ``0..n-1`` once each, one at a time (connections, server caches, lazy init),
    unclocked.  Failures are ignored (the measured runs count them), except a timeout: a server that
    does not answer one query alone would make each of the ``n`` wait out the timeout in turn, so the
    first ends the warm-up with a line naming the target and the timeout.  False if it ended so."""
    timeout_s = getattr(target, "timeout_s", None)
    for i in range(n):
        try:
            async with asyncio.timeout(timeout_s):
                await target.infer(i)
        except (TimeoutError, RequestFailed) as exc:
            if isinstance(exc, TimeoutError) or exc.kind == "timeout":
                within = f" within {timeout_s:g} s (the client timeout)" if timeout_s else ""
                log(f"[load] warm-up ended: no answer from {target.name}{within}; the measured run goes on, "
                    "bounded by its duration plus that timeout")
                return False
        except Exception:  # noqa: BLE001 - warm-up only
            pass
    return True


def _status(sent: int, n: int, state: dict, t: float) -> str:
    return (f"t={t:6.1f}s sent {sent}/{n} done {state['done']} in-flight {state['inflight']} "
            f"errors {state['failed']}")


def schedule(rate: float, duration_s: float | None, max_requests: int | None, pool_len: int,
             seed: int, integer_ms: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times and which pooled query each arrival sends (both seeded)."""
    rng = np.random.default_rng([seed, 1])
    times = arrival_times(rate, duration_s, max_requests, rng, integer_ms)
    return times, rng.integers(0, pool_len, size=times.size)


class LoadSession:
    """A prepared target driven from a private event-loop thread, so synchronous code (the max-load
    search, the profiler) can run many load levels over one connection pool / worker pool."""

    def __init__(self, target: Target, pool: RequestPool, warm: bool = False,
                 before_run: Callable[[], None] | None = None, procs: int = 1, spin_ms: float = 0.0) -> None:
        """``before_run`` is called (unclocked) before every run, e.g. to wait until a server has
        worked off what timed-out queries of the previous run left behind.  ``procs`` > 1 sends the
        runs from that many generator processes; this process still serves the other methods.
        ``spin_ms`` > 0 trades CPU for sub-millisecond send times (see :func:`until`)."""
        if procs < 1 or spin_ms < 0:
            raise RecserveError(f"procs must be >= 1 and spin_ms >= 0, got {procs} and {spin_ms}")
        self.target, self.pool, self.before_run, self.procs = target, pool, before_run, procs
        self.spin_s = spin_ms / 1000.0
        self._spread: Any = None
        if procs > 1:  # before this process prepares the target: the processes get it unprepared
            from recserve.measure.spread import GeneratorProcesses

            self._spread = GeneratorProcesses(target, pool, procs, warm)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recserve-loadgen", daemon=True)
        self._thread.start()
        try:
            self._call(target.prepare(pool))
            if warm:
                self._call(warm_up(target, len(pool)))
        except BaseException:
            self.close()
            raise

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def unloaded_latency_ms(self) -> np.ndarray:
        """Each pooled query sent alone, one after another: latency with no queueing at all (ms).

        If its SLA percentile already misses the target, no arrival rate can meet it.  A query that times out
        leaves the rest unsent and infinitely slow: a server that does not answer would hold each for the timeout."""
        self.settle()

        async def one_by_one() -> list[float]:
            out = []
            for i in range(len(self.pool)):
                t0 = time.perf_counter()
                try:
                    await self.target.infer(i)
                    out.append((time.perf_counter() - t0) * 1000.0)
                except RequestFailed as exc:
                    out.append(float("inf"))
                    if exc.kind == "timeout":
                        return out + [float("inf")] * (len(self.pool) - len(out))
            return out

        return np.asarray(self._call(one_by_one()))

    def settle(self) -> None:
        """Let the target finish abandoned work so runs do not inherit each other's backlog."""
        drain = getattr(self.target, "drain", None)
        if drain is not None:
            self._call(drain())
        if self.before_run is not None:
            self.before_run()

    def outputs(self, i: int) -> dict[str, np.ndarray]:
        """Send pooled query ``i`` once, unclocked, and return the output tensors (network targets)."""
        fetch = getattr(self.target, "infer_outputs", None)
        if fetch is None:
            raise RecserveError(f"target {self.target.name!r} does not return output tensors")
        return self._call(fetch(i))

    def run(self, rate: float, duration_s: float | None = 10.0, max_requests: int | None = None,
            max_inflight: int = 1024, timeout_s: float = 10.0, seed: int = 0, warmup_s: float = 0.0,
            progress: bool = False, min_requests: int = 1, integer_ms: bool = False) -> LoadResult:
        """One run at ``rate``; at least ``min_requests`` queries even if that outlasts ``duration_s``
        (``integer_ms``: DeepRecSys-style integer-millisecond Poisson gaps instead of exponential ones)."""
        times, choice = schedule(rate, duration_s, max_requests, len(self.pool), seed, integer_ms)
        if times.size < min_requests:  # a low rate probe still needs a sample: extend past the duration
            times, choice = schedule(rate, None, min_requests, len(self.pool), seed, integer_ms)
        if times.size == 0:
            raise RecserveError(f"no query arrives within {duration_s}s at {rate} qps; raise the duration or rate")
        self.settle()
        if self._spread is not None:
            outcome = self._spread.run(times, choice, max_inflight, timeout_s, self.spin_s)
        else:
            bar = _Progress(progress, f"[load {rate:.1f} qps]")
            snapshots: list[Callable[[], tuple[np.ndarray, Drive]]] = []
            run = asyncio.run_coroutine_threadsafe(drive(self.target, times, choice, max_inflight, timeout_s, bar,
                                                         spin_s=self.spin_s, snapshots=snapshots), self._loop)
            try:
                outcome = run.result()
            except KeyboardInterrupt as exc:
                bar.done()
                raise RunInterrupted(self._completed(run, snapshots, rate, duration_s, times, choice, warmup_s),
                                     exc) from exc
            bar.done()
        return self._result(rate, duration_s, times, choice, outcome, warmup_s)

    def _completed(self, run: Any, snapshots: list, rate: float, duration_s: float | None, times: np.ndarray,
                   choice: np.ndarray, warmup_s: float) -> LoadResult | None:
        """An interrupted run stopped (its queries in flight cancelled) and what completed before, or None."""
        run.cancel()
        self._call(_cancel_others())
        if not snapshots:
            return None
        idx, outcome = snapshots[0]()
        if idx.size == 0:
            return None
        return self._result(rate, duration_s, times[idx], choice[idx], outcome, warmup_s)

    def _result(self, rate: float, duration_s: float | None, times: np.ndarray, choice: np.ndarray, outcome: Drive,
                warmup_s: float) -> LoadResult:
        """Counts and latencies over the measured window (queries scheduled after ``warmup_s``)."""
        run_s = max(float(times[-1]), outcome.last_s)
        keep = times >= warmup_s
        latency = outcome.latency_ms[keep]
        failed = Counter(kd for kd, m in zip(outcome.kinds, keep, strict=True) if m and kd is not None)
        sizes = np.asarray(self.pool.sizes)[choice]
        return LoadResult(
            target=self.target.name, offered_qps=rate, duration_s=float(duration_s or times[-1]),
            elapsed_s=run_s - min(warmup_s, run_s), sent=int(times.size), latencies_ms=latency[~np.isnan(latency)],
            errors=dict(failed), send_lag_ms=outcome.lag_ms[keep], mean_size=float(sizes.mean()),
            measured=int(keep.sum()), procs=self.procs, run_s=run_s, cpu_s=outcome.cpu_s,
            loop_cpu_s=outcome.loop_cpu_s, refused_ms=_answered(outcome.refused_ms, keep),
            refusal_reasons=dict(Counter(r for r, m in zip(outcome.reasons or [None] * len(keep), keep, strict=True)
                                         if m and r is not None)),
        )

    def close(self) -> None:
        if self._spread is not None:
            self._spread.close()
        if self._loop.is_closed():
            return
        try:
            self._call(_cancel_others())  # a run a Ctrl-C left behind ends here, not as a destroyed pending task
            self._call(self.target.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> LoadSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_load(target: Target, rate: float, duration_s: float | None, pool: RequestPool, *,
             max_requests: int | None = None, max_inflight: int = 1024, timeout_s: float = 10.0, seed: int = 0,
             warmup_s: float = 0.0, progress: bool = False, min_requests: int = 1, procs: int = 1) -> LoadResult:
    """One open-loop run of ``pool``'s queries against ``target`` at ``rate`` queries/s (from ``procs``
    generator processes; for many runs keep one :class:`LoadSession`, which starts them once)."""
    with LoadSession(target, pool, procs=procs) as session:
        return session.run(rate, duration_s, max_requests, max_inflight, timeout_s, seed, warmup_s, progress,
                           min_requests)
