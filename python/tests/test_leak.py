"""Reference counting: 100 000 calls through every path (fresh, replay, the action raising,
a busy key, begin and complete, events) leave neither Python objects nor memory behind.
RSS and the count of live objects are measured after a warm-up and after the calls."""

from __future__ import annotations

import asyncio
import gc
import os

import idem

CALLS = 100_000
ROUNDS = 3_000
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def test_no_leak_over_100000_calls(scope):
    store = idem.open_store("memory:")
    events = [0]

    def on_event(e):
        events[0] += 1

    ex = idem.Executor(store, on_event=on_event)
    holder = ex.begin(scope, "held")
    payload = {"items": list(range(10)), "blob": "x" * 100}

    def action(attempt):
        return payload

    def failing(attempt):
        raise ValueError("no")

    def one_round(i: int) -> int:
        calls = 0
        r = ex.run(scope, "k", action)  # fresh
        assert not r.replayed and r.token
        r = ex.run(scope, "k", action)  # replay
        assert r.replayed and r.value == payload
        store.forget(scope, "k")
        calls += 2
        if i % 4 == 0:
            try:
                ex.run(scope, "boom", failing)
            except ValueError:
                pass
            try:
                ex.run(scope, "held", action)
            except idem.InProgress:
                pass
            with ex.begin(scope, b"bytes-key") as a:
                a.add_stop_callback(lambda: None)
                a.complete(b"\x00" * 64)
            store.forget(scope, b"bytes-key")
            calls += 3
        return calls

    done = 0
    i = 0
    while done < 20_000:  # warm-up: the allocator's pools and the store's tables grow
        done += one_round(i)
        i += 1
    gc.collect()
    rss_before, objects_before = rss(), len(gc.get_objects())
    done = 0
    while done < CALLS:
        done += one_round(i)
        i += 1
    gc.collect()
    rss_after, objects_after = rss(), len(gc.get_objects())
    holder.release()
    ex.close(timeout=0)
    growth = rss_after - rss_before
    print(f"{done} calls ({events[0]} events): RSS {rss_before / 2**20:.1f} -> "
          f"{rss_after / 2**20:.1f} MiB, live objects {objects_before} -> {objects_after}")
    # One leaked object per call would be several MiB; a leaked reference shows as objects.
    assert growth < 2 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over {done} calls"
    assert objects_after - objects_before < 100


def test_no_leak_over_asyncio_waits(scope):
    # begin_async's wait in the C++ executor, through each of its ends: woken by the owner's
    # complete (a replay), cancelled, and the bound running out.
    store = idem.open_store("memory:")
    ex = idem.Executor(store, lease=3600, initial_backoff=600, max_backoff=600)
    held = ex.begin(scope, "held")

    async def in_wait(task):
        while ex.waiting_async == 0:
            assert not task.done(), task
            await asyncio.sleep(0.0002)

    async def one_round(i: int) -> None:
        key = f"k{i % 100}"
        owner = await ex.begin_async(scope, key)
        task = asyncio.ensure_future(ex.run_async(scope, key, lambda a: "waiter's", wait=600))
        await in_wait(task)
        await owner.complete("owner's")
        assert (await task).replayed
        store.forget(scope, key)
        task = asyncio.ensure_future(ex.run_async(scope, "held", lambda a: 0, wait=600))
        await in_wait(task)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        while ex.waiting_async:
            await asyncio.sleep(0.0002)
        try:
            await ex.run_async(scope, "held", lambda a: 0, wait=0.001)
        except idem.InProgress:
            pass

    async def main():
        i = 0
        for _ in range(ROUNDS // 5):  # warm-up
            await one_round(i)
            i += 1
        gc.collect()
        before = rss(), len(gc.get_objects())
        for _ in range(ROUNDS):
            await one_round(i)
            i += 1
        gc.collect()
        return before, (rss(), len(gc.get_objects()))

    try:
        (rss_before, objects_before), (rss_after, objects_after) = asyncio.run(main())
    finally:
        held.release()
        ex.close(timeout=0)
    growth = rss_after - rss_before
    print(f"{ROUNDS} rounds of 3 waits: RSS {rss_before / 2**20:.1f} -> "
          f"{rss_after / 2**20:.1f} MiB, live objects {objects_before} -> {objects_after}")
    assert growth < 2 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over {ROUNDS} rounds"
    assert objects_after - objects_before < 100
