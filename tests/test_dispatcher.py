"""One Dispatcher, several drivers: the simulator and the live router make the same decisions."""

from __future__ import annotations

import asyncio
import heapq

import numpy as np
import pytest

from recserve.policies.dispatch import make_instances, make_policy
from recserve.policies.dispatcher import Dispatcher
from recserve.policies.router import Backend, PoolConfig, Router
from recserve.sim.cluster import replay

QOS_MS = 60.0
BACKENDS = [Backend("http://fast", "fast", slots=2, base=True), Backend("http://slow", "slow", slots=2)]
POOL = ["fast", "fast", "slow", "slow"]


def recorded_trace(n: int = 300, qps: float = 180.0, seed: int = 7) -> tuple[list[int], list[float], list[list[float]]]:
    """Sizes, arrival times (ms) and per-type service times (ms) of ``n`` queries."""
    rng = np.random.default_rng(seed)
    sizes = (rng.integers(1, 100, n) * 10).tolist()
    arrivals = np.cumsum(rng.exponential(1000.0 / qps, n)).tolist()
    noise = np.exp(0.2 * rng.standard_normal(n))
    service = [[(2.0 + 0.02 * s) * z, (1.0 + 0.06 * s) * z] for s, z in zip(sizes, noise, strict=True)]
    return sizes, arrivals, service


async def drive_router(policy_name: str, sizes: list[int], arrivals: list[float],
                       service: list[list[float]]) -> list[tuple[float, int, int]]:
    """Replay the trace through the live router on a virtual clock: the transport answers each query after its
    recorded service time on the instance's type, events are taken in the simulator's order."""
    clock = [0.0]
    done: list[tuple[float, int, asyncio.Future]] = []

    async def transport(inst, model, body, headers):
        qid = int(body)
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(done, (clock[0] + service[qid][inst.type_idx], qid, fut))
        return await fut

    # a query's wait limit runs on the loop's own clock, not the virtual one driven here (the simulator has none):
    # on a busy host a query queued for a few virtual ms can wait past 2 x QOS_MS of real time and be answered 504
    pool = PoolConfig(BACKENDS, QOS_MS, deadline_ms=600_000.0)
    router = Router(pool, make_policy(policy_name, QOS_MS), transport=transport, clock=lambda: clock[0], record=True)
    assert [i.type_name for i in router.instances] == POOL
    tasks, finished = [], 0

    async def settle() -> None:  # until every started query reached the transport and every answer was taken
        for _ in range(10_000):
            started = len(router.dispatcher.decisions)
            if (started == len(done) + finished and sum(i.served for i in router.instances) == finished
                    and router.dispatcher._next_id == len(tasks)):
                return
            await asyncio.sleep(0)
        raise AssertionError("router did not settle")

    i = 0
    while i < len(arrivals) or done:
        t_arr = arrivals[i] if i < len(arrivals) else float("inf")
        if done and done[0][0] <= t_arr:
            clock[0], _, fut = heapq.heappop(done)
            finished += 1
            fut.set_result((200, b"", {}))
        else:
            clock[0] = t_arr
            tasks.append(asyncio.create_task(router.submit("m", str(i).encode(), {}, sizes[i])))
            i += 1
        await settle()
    await asyncio.gather(*tasks)
    return router.dispatcher.decisions


@pytest.mark.parametrize("policy_name", ["kairos", "ribbon", "clockwork"])
def test_simulator_and_live_router_make_the_same_dispatch_decisions(policy_name):
    sizes, arrivals, service = recorded_trace()
    simulated = replay(make_policy(policy_name, QOS_MS), POOL, sizes, arrivals, service, QOS_MS, record=True)
    live = asyncio.run(drive_router(policy_name, sizes, arrivals, service))
    assert len(simulated.decisions) == len(sizes)
    assert live == simulated.decisions
    assert len({inst for _, _, inst in live}) == len(POOL)  # the trace exercises every instance


def test_query_bucket_is_the_policy_bucket_of_its_size():
    policy = make_policy("kairos", QOS_MS)
    instances, types = make_instances(POOL)
    started = []
    d = Dispatcher(policy, instances, types, lambda q, inst, now: started.append((q, inst)))
    q = d.arrive(0.0, 437)
    assert q.bucket == policy.predictor.bucket(437) == 43
    assert started and started[0][0] is q and not d.queue


def test_local_fifo_starts_next_query_on_completion():
    policy = make_policy("clockwork", QOS_MS)
    instances, types = make_instances(["only"])
    started = []
    d = Dispatcher(policy, instances, types, lambda q, inst, now: started.append(q.id))
    d.arrive(0.0, 10)
    d.arrive(1.0, 10)  # clockwork queues it on the busy instance
    assert started == [0] and len(instances[0].local) == 1 and not d.idle
    d.complete(5.0, instances[0])
    assert started == [0, 1] and not instances[0].local
    d.complete(9.0, instances[0])
    assert d.idle == instances and instances[0].served == 2
