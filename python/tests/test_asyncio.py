"""asyncio: run_async and begin_async never block the event loop, tasks racing one key run
it once, the heartbeat keeps leases alive while the loop runs user code, and cancellation
releases the key."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time

import pytest

import idem
from conftest import eventually, spawn, store_url


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


def test_lease_lost_reads_true_after_an_async_complete_raised_lease_lost(store, scope):
    ex = idem.Executor(store, lease=60)
    other = idem.Executor(store)

    async def main():
        async with ex.begin_async(scope, "k") as attempt:
            store.forget(scope, "k")
            other.begin(scope, "k").complete("theirs")
            assert not attempt.lease_lost  # the heartbeat has not come round
            with pytest.raises(idem.LeaseLost):
                await attempt.complete("mine")
            assert attempt.lease_lost
            assert attempt.attempt.lease_lost

    try:
        asyncio.run(main())
    finally:
        ex.close(timeout=0)
        other.close(timeout=0)


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


# --- waiting without polling (SPEC §7, issue 23) ---
#
# A waiter below polls the store every NEVER seconds at the most and waits NEVER seconds in
# all, and its owner's lease is longer still (a waiter also asks when the owner's lease runs
# out): what answers it within HANG_GUARD (a guard against a hang, not a speed assertion) can
# only be a wake, in memory for an owner in this process, by the store's notification for an
# owner in another.

NEVER = 600
HANG_GUARD = 60
LONG_LEASE = 3600


def slow_poller(store_or_url):
    """An executor whose waits are answered only by a wake (its own leases are long too)."""
    return idem.Executor(
        store_or_url, lease=LONG_LEASE, wait=NEVER, initial_backoff=NEVER, max_backoff=NEVER
    )


def notifying_url(kind, tmp_path):
    """A store URL whose store notifies other processes (PostgreSQL: notify=on)."""
    url = store_url(kind, tmp_path)
    if kind == "postgres":
        url += ("&" if "?" in url else "?") + "notify=on"
    return url


async def until(check, what):
    """Lets the loop run until check() holds; fails naming `what` after HANG_GUARD."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD
    while not check():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def waiting_in_cpp(ex, task):
    """Until the task's call waits in the C++ executor (its first ask found the key busy),
    then a moment more, so that its wait has started to watch the key."""
    await until(lambda: ex.waiting_async == 1 or task.done(), "the waiter to wait")
    assert not task.done(), task
    await asyncio.sleep(0.2)
    assert not task.done(), task


def spawn_owner(url, scope, key):
    owner = spawn("own.py", url, scope, key, stdin=subprocess.PIPE)
    line = owner.stdout.readline()
    exited = owner.poll() is not None
    assert line.startswith("token "), (line, owner.stderr.read() if exited else "")
    return owner


def tell_owner(owner, command):
    owner.stdin.write(command + "\n")
    owner.stdin.flush()
    assert owner.stdout.readline() == "done\n"


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def notifying_kind(request):
    return request.param


@pytest.mark.parametrize("end", ["complete", "release"])
def test_a_waiter_is_woken_when_an_owner_in_another_process_ends(
    notifying_kind, end, tmp_path, scope
):
    # complete: the waiter gets the owner's result, replayed. release: it acquires the key
    # as attempt 1 (not a takeover: the lease had not run out).
    url = notifying_url(notifying_kind, tmp_path)
    owner = spawn_owner(url, scope, "k")
    ex = slow_poller(url)
    runs = []

    def action(attempt):
        runs.append((attempt.number, attempt.stolen))
        return "waiter's"

    async def main():
        task = asyncio.create_task(ex.run_async(scope, "k", action))
        await waiting_in_cpp(ex, task)
        tell_owner(owner, "complete owner's" if end == "complete" else "release")
        return await asyncio.wait_for(task, HANG_GUARD)

    try:
        r = asyncio.run(main())
        if end == "complete":
            assert r.replayed and r.value == "owner's" and not runs
        else:
            assert not r.replayed and r.value == "waiter's"
            assert runs == [(1, False)]
        assert ex.waiting_async == 0 and ex.active_leases == 0
    finally:
        ex.close(timeout=0)
        owner.kill()
        owner.communicate()


@pytest.mark.parametrize("owner_is", ["task", "thread"])
def test_a_waiter_is_woken_when_an_owner_in_this_process_completes(store, scope, owner_is):
    # On every store, in memory: the owner is a call of the same executor.
    ex = slow_poller(store)

    async def main():
        if owner_is == "task":
            attempt = await ex.begin_async(scope, "k")
            complete = attempt.complete
        else:
            held, finish = threading.Event(), threading.Event()

            def own():
                with ex.begin(scope, "k") as a:
                    held.set()
                    finish.wait()
                    a.complete("owner's")

            thread = threading.Thread(target=own)
            thread.start()
            held.wait()

            async def complete(value):
                finish.set()
                await asyncio.get_running_loop().run_in_executor(None, thread.join)

        task = asyncio.create_task(ex.run_async(scope, "k", lambda a: "waiter's"))
        await waiting_in_cpp(ex, task)
        await complete("owner's")
        return await asyncio.wait_for(task, HANG_GUARD)

    try:
        r = asyncio.run(main())
        assert r.replayed and r.value == "owner's"
        assert ex.waiting_async == 0 and ex.active_leases == 0
    finally:
        ex.close(timeout=0)


def test_cancelling_a_waiting_task_ends_its_wait(store, scope):
    owner = idem.Executor(store, lease=LONG_LEASE)
    ex = slow_poller(store)

    async def main():
        held = await owner.begin_async(scope, "k")
        task = asyncio.create_task(ex.run_async(scope, "k", lambda a: "waiter's"))
        await waiting_in_cpp(ex, task)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The C++ wait ended at once (its bound is NEVER seconds away), holding nothing.
        await until(lambda: ex.waiting_async == 0, "the cancelled wait to end")
        assert ex.active_leases == 0
        await held.complete("owner's")
        assert (await ex.run_async(scope, "k", lambda a: "x")).value == "owner's"

    try:
        asyncio.run(main())
    finally:
        ex.close(timeout=0)
        owner.close(timeout=0)


def test_a_cancel_racing_the_wake_leaves_no_lease(store, scope):
    # The owner releases and the waiting task is cancelled at once, in every order the
    # threads allow: the wait is given up before it acquires, or it acquires for a task that
    # is already cancelled (its lease is given back, by the waiting thread or by the task).
    # The owner is a call of the same executor, so that its release wakes the wait at once.
    ex = slow_poller(store)

    async def begin(key):
        return await ex.begin_async(scope, key)

    async def main():
        for i in range(40):
            key = f"k{i}"
            held = ex.begin(scope, key)
            task = asyncio.create_task(begin(key))
            await until(lambda: ex.waiting_async == 1, "the waiter to wait")
            held.release()
            time.sleep(0.0005 * (i % 5))  # the waiting thread may acquire meanwhile
            task.cancel()  # before the task can see any answer: the loop is blocked here
            with pytest.raises(asyncio.CancelledError):
                await task
            # A lease acquired for the cancelled task is released on the waiting thread (or
            # on the pool): the record goes soon after the lease is counted out.
            await until(
                lambda: ex.waiting_async == 0
                and ex.active_leases == 0
                and store.get(scope, key) is None,
                "the wait to end and its lease to be released",
            )

    try:
        asyncio.run(main())
    finally:
        ex.close(timeout=0)


def test_a_wait_ends_with_in_progress_at_its_bound(store, scope):
    owner = idem.Executor(store, lease=LONG_LEASE)
    ex = idem.Executor(store, initial_backoff=NEVER, max_backoff=NEVER)

    async def main():
        async with owner.begin_async(scope, "k"):
            with pytest.raises(idem.InProgress) as e:
                await asyncio.wait_for(
                    ex.run_async(scope, "k", lambda a: "waiter's", wait=0.3), HANG_GUARD
                )
            assert e.value.lease_remaining > 0 and e.value.key == "k"
            assert ex.waiting_async == 0

    try:
        asyncio.run(main())
    finally:
        ex.close(timeout=0)
        owner.close(timeout=0)


@pytest.mark.parametrize("closed_from", ["loop", "thread"])
def test_closing_the_executor_ends_a_wait_with_shut_down(store, scope, closed_from):
    owner = idem.Executor(store, lease=LONG_LEASE)
    ex = slow_poller(store)

    async def main():
        async with owner.begin_async(scope, "k"):
            task = asyncio.create_task(ex.run_async(scope, "k", lambda a: "waiter's"))
            await waiting_in_cpp(ex, task)
            if closed_from == "loop":
                ex.close(timeout=0)
            else:
                await asyncio.get_running_loop().run_in_executor(None, ex.close, 0)
            with pytest.raises(idem.ShutDown):
                await asyncio.wait_for(task, HANG_GUARD)
            assert ex.waiting_async == 0 and ex.active_leases == 0

    try:
        asyncio.run(main())
    finally:
        ex.close(timeout=0)
        owner.close(timeout=0)
