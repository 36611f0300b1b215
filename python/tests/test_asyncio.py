"""asyncio: run_async and begin_async never block the event loop, tasks racing one key run
it once, the heartbeat keeps leases alive while the loop runs user code, and cancellation
releases the key."""

from __future__ import annotations

import asyncio

import pytest

import idem
from conftest import eventually


def test_run_async_fresh_then_replay(executor, scope):
    async def main():
        async def action(attempt):
            assert idem.current_attempt() is attempt
            await asyncio.sleep(0)
            return {"token": attempt.token}

        first = await executor.run_async(scope, "k", action)
        assert not first.replayed and first.value == {"token": first.token}
        again = await executor.run_async(scope, "k", action)
        assert again.replayed and again.value == first.value
        # A plain function works too.
        assert (await executor.run_async(scope, "k2", lambda a: 5)).value == 5

    asyncio.run(main())


def test_begin_async_as_an_async_context_manager(executor, store, scope):
    async def main():
        async with executor.begin_async(scope, "k") as attempt:
            assert attempt.active and attempt.number == 1
            r = await attempt.complete("done")
            assert not r.replayed and r.value == "done"
        async with executor.begin_async(scope, "k") as again:
            assert again.replayed and again.value == "done"
        attempt = await executor.begin_async(scope, "plain await")
        await attempt.release()
        assert store.get(scope, "plain await") is None

    asyncio.run(main())


def test_an_exception_in_the_block_or_the_action_releases(executor, store, scope):
    async def main():
        with pytest.raises(KeyError):
            async with executor.begin_async(scope, "k"):
                raise KeyError("boom")
        assert store.get(scope, "k") is None
        boom = RuntimeError("upstream down")

        async def action(attempt):
            raise boom

        with pytest.raises(RuntimeError) as e:
            await executor.run_async(scope, "k", action)
        assert e.value is boom
        assert store.get(scope, "k") is None

    asyncio.run(main())


def test_a_cancelled_task_releases_its_key(executor, store, scope):
    async def main():
        inside = asyncio.Event()

        async def action(attempt):
            inside.set()
            await asyncio.sleep(60)

        task = asyncio.create_task(executor.run_async(scope, "k", action))
        await inside.wait()
        assert store.get(scope, "k")["state"] == "in_progress"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert store.get(scope, "k") is None

    asyncio.run(main())


def test_tasks_racing_one_key_run_it_once(executor, scope):
    async def main():
        runs = []

        async def action(attempt):
            runs.append(attempt.token)
            await asyncio.sleep(0.05)
            return f"token {attempt.token}"

        for round_ in range(3):
            runs.clear()
            results = await asyncio.gather(
                *(executor.run_async(scope, f"k{round_}", action, wait=30) for _ in range(50))
            )
            assert len(runs) == 1
            assert {r.value for r in results} == {f"token {runs[0]}"}
            assert sum(not r.replayed for r in results) == 1

    asyncio.run(main())


def test_tasks_on_several_executors_race_one_key(store, scope):
    executors = [idem.Executor(store, initial_backoff=0.005) for _ in range(3)]

    async def main():
        runs = []

        async def action(attempt):
            runs.append(1)
            await asyncio.sleep(0.02)
            return "once"

        results = await asyncio.gather(
            *(executors[i % 3].run_async(scope, "k", action, wait=30) for i in range(30))
        )
        assert len(runs) == 1 and {r.value for r in results} == {"once"}

    try:
        asyncio.run(main())
    finally:
        for ex in executors:
            ex.close(timeout=0)


def test_waiting_does_not_block_the_event_loop(store, scope):
    # The owner and the waiter are tasks of one loop. Had the waiter's wait blocked the
    # loop, the owner could never complete, and the waiter would end with InProgress.
    for same in (True, False):
        owner_ex = idem.Executor(store)
        waiter_ex = owner_ex if same else idem.Executor(store, initial_backoff=0.005)

        async def main():
            attempt = await owner_ex.begin_async(scope, f"k-{same}")
            waiter = asyncio.create_task(
                waiter_ex.run_async(scope, f"k-{same}", lambda a: "waiter ran", wait=60)
            )
            for _ in range(20):
                await asyncio.sleep(0.005)  # the loop keeps turning
            assert not waiter.done()
            await attempt.complete("owner's")
            r = await waiter
            assert r.replayed and r.value == "owner's"

        try:
            asyncio.run(main())
        finally:
            owner_ex.close(timeout=0)
            if not same:
                waiter_ex.close(timeout=0)


def test_a_busy_key_raises_in_progress_after_the_wait(executor, scope):
    async def main():
        async with executor.begin_async(scope, "k"):
            with pytest.raises(idem.InProgress) as e:
                await executor.run_async(scope, "k", lambda a: 1)
            assert e.value.lease_remaining > 0
            with pytest.raises(idem.InProgress):
                await executor.run_async(scope, "k", lambda a: 1, wait=0.05)

    asyncio.run(main())


def test_the_heartbeat_keeps_the_lease_while_the_loop_runs_user_code(store, scope):
    # A 0.2 s lease, an action that takes six times that on the loop: the heartbeat thread
    # extends the lease meanwhile, so another caller finds the key busy throughout and the
    # result is recorded, not refused.
    ex = idem.Executor(store, lease=0.2)
    other = idem.Executor(store)

    async def main():
        async def slow(attempt):
            for _ in range(6):
                await asyncio.sleep(0.2)
                with pytest.raises(idem.InProgress):
                    await other.run_async(scope, "k", lambda a: "stolen")
                assert not attempt.lease_lost
            return "finished"

        r = await ex.run_async(scope, "k", slow)
        assert r.value == "finished" and not r.replayed
        assert (await other.run_async(scope, "k", lambda a: "x")).value == "finished"

    try:
        asyncio.run(main())
    finally:
        ex.close(timeout=0)
        other.close(timeout=0)


def test_a_lost_lease_settles_the_stopped_future(store, scope):
    ex = idem.Executor(store, lease=0.6, heartbeat=0.05)

    async def main():
        async with ex.begin_async(scope, "k") as attempt:
            stopped = attempt.stopped()
            store.forget(scope, "k")
            await asyncio.wait_for(stopped, 30)
            assert attempt.lease_lost
            with pytest.raises(idem.LeaseLost):
                await attempt.complete("late")

    try:
        asyncio.run(main())
    finally:
        ex.close(timeout=0)
