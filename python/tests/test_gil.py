"""The GIL is released around store calls and waits: a thread blocked in idem never stops
the other Python threads. Each test fails if the blocked call held the GIL: the thread that
must unblock it could not run, and the call would end with an error instead."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

import idem


def spin(seconds: float) -> int:
    """Pure-Python work for `seconds`: it needs the GIL all along."""
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
    return n


@pytest.mark.parametrize("same_executor", [True, False])
def test_a_long_wait_for_a_busy_key_does_not_block_other_threads(store, scope, same_executor):
    # A waits up to 60 s for the owner. This thread meanwhile does Python work and then
    # completes the owner's attempt: A gets the owner's result. Had A's wait held the GIL,
    # this thread could not have completed, and A would have ended with InProgress.
    owner = idem.Executor(store)
    waiter = owner if same_executor else idem.Executor(store, initial_backoff=0.005)
    try:
        attempt = owner.begin(scope, "k")
        started = threading.Event()
        got = {}

        def wait_for_it():
            started.set()
            try:
                got["r"] = waiter.run(scope, "k", lambda a: "waiter ran", wait=60)
            except idem.Error as e:
                got["r"] = e

        t = threading.Thread(target=wait_for_it)
        t.start()
        started.wait()
        assert spin(0.3) > 0
        attempt.complete("owner's")
        t.join(60)
        assert not isinstance(got["r"], Exception), got["r"]
        assert got["r"].replayed and got["r"].value == "owner's"
    finally:
        owner.close(timeout=0)
        if waiter is not owner:
            waiter.close(timeout=0)


def test_a_blocking_store_call_does_not_block_other_threads(tmp_path, scope):
    # Another connection holds SQLite's write lock; idem's acquire waits for it (up to the
    # store's 5 s busy timeout). This thread does Python work, then commits: the acquire
    # goes through. Had the acquire held the GIL, the commit could not happen before the
    # busy timeout, and the call would fail with StoreUnavailable.
    path = tmp_path / "locked.db"
    ex = idem.Executor(f"sqlite://{path}")
    try:
        ex.run(scope, "warm", lambda a: 1)  # the schema exists
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        started = threading.Event()
        got = {}

        def call():
            started.set()
            try:
                got["r"] = ex.run(scope, "k", lambda a: "ran")
            except idem.Error as e:
                got["r"] = e

        t = threading.Thread(target=call)
        t.start()
        started.wait()
        assert spin(0.5) > 0
        blocker.execute("COMMIT")
        t.join(60)
        blocker.close()
        assert not isinstance(got["r"], Exception), got["r"]
        assert got["r"].value == "ran"
    finally:
        ex.close(timeout=0)
