"""bench_peers' interleaving: the searches of several servers probe strictly in turn."""

from __future__ import annotations

import threading

from benchmarks.bench_peers import Turns


def _run(turns: Turns, i: int, probes: int, log: list[int]) -> None:
    try:
        for _ in range(probes):
            with turns.take(i):
                log.append(i)
    finally:
        turns.finish(i)


def test_searches_alternate_and_a_finished_one_drops_out() -> None:
    turns, log = Turns(3), []
    threads = [threading.Thread(target=_run, args=(turns, i, n, log)) for i, n in enumerate((2, 4, 3))]
    for t in reversed(threads):  # started in any order, the rotation still begins at the first
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert log == [0, 1, 2, 0, 1, 2, 1, 2, 1]


def test_a_search_that_ends_before_its_first_probe_does_not_block_the_others() -> None:
    turns, log = Turns(2), []
    turns.finish(0)  # e.g. its server failed to start
    worker = threading.Thread(target=_run, args=(turns, 1, 3, log))
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive() and log == [1, 1, 1]
