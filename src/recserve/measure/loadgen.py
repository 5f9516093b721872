"""Open-loop load generator: Poisson arrivals at a fixed rate, latency counted from the schedule.

Every query has a *scheduled* send time drawn before the run (exponential gaps, seeded).  Its
latency is ``completion − scheduled``, never ``completion − actual send``: if the server (or this
generator) falls behind, the wait is charged to the queries that suffered it, so a slow server
cannot hide its queueing (no coordinated omission).  In-flight queries are capped; a query that
arrives while the cap is reached is not sent and counts as ``dropped``.  Failures are counted by
kind (``http_503``, ``grpc_UNAVAILABLE``, ``timeout``, ``dropped`` …) and, for SLA purposes, count
as infinitely slow.

Use :func:`run_load` for one run, or :class:`LoadSession` to keep one target (connection pool,
worker processes) across many runs, e.g. inside a max-load search.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
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
                f"{self.ok}/{self.measured} ok; errors: {errs}")

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
            "send_lag_ms_p99": float(np.percentile(self.send_lag_ms, 99)) if self.send_lag_ms.size else None,
        }


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None


class _Progress:
    """One self-overwriting status line on stderr, at most every ``every`` seconds."""

    def __init__(self, enabled: bool, label: str, every: float = 0.5) -> None:
        self.enabled, self.label, self.every = enabled, label, every
        self._last = 0.0

    def update(self, text: Callable[[], str], force: bool = False) -> None:
        """``text`` is only called when a line is due, so the hot loop pays for a clock read only."""
        now = time.monotonic()
        if self.enabled and (force or now - self._last >= self.every):
            self._last = now
            print(f"\r{self.label} {text()}\033[K", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled:
            print(file=sys.stderr, flush=True)


async def drive(target: Target, times: np.ndarray, choice: np.ndarray, max_inflight: int, timeout_s: float,
                warmup_s: float = 0.0, progress: _Progress | None = None) -> tuple[np.ndarray, list, np.ndarray, float]:
    """Send query ``choice[k]`` at ``times[k]`` (s from start); returns per-query latency (ms, NaN when
    failed), failure kinds (None when ok), send lag (ms) and the elapsed time to the last completion."""
    loop = asyncio.get_running_loop()
    n = len(times)
    latency = np.full(n, np.nan)
    kinds: list[str | None] = [None] * n
    lag = np.zeros(n)
    state = {"inflight": 0, "done": 0, "failed": 0, "last": 0.0}
    start = loop.time() + 0.005

    async def one(k: int) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                await target.infer(int(choice[k]))
            latency[k] = (loop.time() - start - times[k]) * 1000.0
        except RequestFailed as exc:
            kinds[k] = exc.kind
        except TimeoutError:
            kinds[k] = "timeout"
        except Exception as exc:  # any other client-side failure is still one failed query
            kinds[k] = f"exception_{type(exc).__name__}"
        finally:
            state["failed"] += kinds[k] is not None
            state["inflight"] -= 1
            state["done"] += 1
            state["last"] = loop.time() - start

    tasks: set[asyncio.Task] = set()
    unyielded = 0
    for k in range(n):
        delay = start + times[k] - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
            unyielded = 0
        elif (unyielded := unyielded + 1) >= 32:
            await asyncio.sleep(0)  # behind schedule: still let responses in
            unyielded = 0
        lag[k] = (loop.time() - start - times[k]) * 1000.0
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
    while tasks:
        await asyncio.wait(set(tasks), timeout=0.5)
        if progress is not None:
            progress.update(lambda: _status(n, n, state, loop.time() - start))
    elapsed = max(float(times[-1]) if n else 0.0, state["last"])
    keep = times >= warmup_s
    elapsed -= min(warmup_s, elapsed)  # rates are over the measured window only
    return latency[keep], [kd for kd, m in zip(kinds, keep, strict=True) if m], lag[keep], elapsed


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
                 before_run: Callable[[], None] | None = None) -> None:
        """``before_run`` is called (unclocked) before every run, e.g. to wait until a server has
        worked off what timed-out queries of the previous run left behind."""
        self.target, self.pool, self.before_run = target, pool, before_run
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recserve-loadgen", daemon=True)
        self._thread.start()
        try:
            self._call(target.prepare(pool))
            if warm:
                self._call(self._warm())
        except BaseException:
            self.close()
            raise

    async def _warm(self) -> None:
        """Send every pooled query once, one at a time (connections, server caches, lazy init), unclocked.
        Failures here are ignored: the measured runs count them."""
        for i in range(len(self.pool)):
            try:
                await self.target.infer(i)
            except Exception:  # noqa: BLE001 - warm-up only
                pass

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def unloaded_latency_ms(self) -> np.ndarray:
        """Each pooled query sent alone, one after another: latency with no queueing at all (ms).

        If its SLA percentile already misses the target, no arrival rate can meet it."""
        self.settle()

        async def one_by_one() -> list[float]:
            out = []
            for i in range(len(self.pool)):
                t0 = time.perf_counter()
                try:
                    await self.target.infer(i)
                    out.append((time.perf_counter() - t0) * 1000.0)
                except RequestFailed:
                    out.append(float("inf"))
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
        bar = _Progress(progress, f"[load {rate:.1f} qps]")
        latency, kinds, lag, elapsed = self._call(
            drive(self.target, times, choice, max_inflight, timeout_s, warmup_s, bar))
        bar.done()
        failed = Counter(k for k in kinds if k is not None)
        sizes = np.asarray(self.pool.sizes)[choice]
        return LoadResult(
            target=self.target.name, offered_qps=rate, duration_s=float(duration_s or times[-1]),
            elapsed_s=elapsed, sent=int(times.size), latencies_ms=latency[~np.isnan(latency)],
            errors=dict(failed), send_lag_ms=lag, mean_size=float(sizes.mean()), measured=len(kinds),
        )

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
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
             warmup_s: float = 0.0, progress: bool = False, min_requests: int = 1) -> LoadResult:
    """One open-loop run of ``pool``'s queries against ``target`` at ``rate`` queries/s."""
    with LoadSession(target, pool) as session:
        return session.run(rate, duration_s, max_requests, max_inflight, timeout_s, seed, warmup_s, progress,
                           min_requests)
