"""Threads racing one key: exactly one run, every thread gets its result (SPEC §5, §7)."""

from __future__ import annotations

import threading

import idem
from conftest import eventually

THREADS = 16


def race(executors, scope, key, wait=30):
    runs = []
    results = [None] * THREADS
    errors = []
    start = threading.Barrier(THREADS)

    def worker(i):
        ex = executors[i % len(executors)]
        start.wait()
        try:
            results[i] = ex.run(scope, key, lambda a: runs.append(i) or f"by {i}", wait=wait)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return runs, results, errors


def test_threads_on_one_executor_race_one_key(executor, scope):
    for round_ in range(5):
        runs, results, errors = race([executor], scope, f"k{round_}")
        assert errors == []
        assert len(runs) == 1
        assert {r.value for r in results} == {f"by {runs[0]}"}
        assert sum(not r.replayed for r in results) == 1


def test_threads_on_several_executors_race_one_key(store, scope):
    # Several executors over one store stand for several processes: they meet in the store.
    executors = [idem.Executor(store, initial_backoff=0.002) for _ in range(4)]
    try:
        for round_ in range(3):
            runs, results, errors = race(executors, scope, f"k{round_}")
            assert errors == []
            assert len(runs) == 1
            assert {r.value for r in results} == {f"by {runs[0]}"}
    finally:
        for ex in executors:
            ex.close(timeout=0)


def test_fail_fast_duplicates_get_in_progress_never_a_second_run(executor, scope):
    gate = threading.Event()
    runs = []
    outcomes = []

    def owner_action(a):
        runs.append("owner")
        gate.wait(30)
        return "owner"

    owner = threading.Thread(target=lambda: outcomes.append(executor.run(scope, "k", owner_action)))
    owner.start()
    eventually(lambda: executor.active_leases == 1, "the owner to hold the key")
    for _ in range(20):
        try:
            executor.run(scope, "k", lambda a: runs.append("dup"))
        except idem.InProgress:
            outcomes.append("busy")
    gate.set()
    owner.join(30)
    assert runs == ["owner"]
    assert outcomes.count("busy") == 20
