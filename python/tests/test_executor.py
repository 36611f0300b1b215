"""The executor's behaviour on every store (SPEC §4, §5, §7): replay, busy, waiting,
fencing, release on exception, lost leases, begin as a context manager."""

from __future__ import annotations

import datetime
import threading

import pytest

import idem
from conftest import eventually


def test_fresh_run_then_replay(executor, scope):
    calls = []

    def action(attempt):
        calls.append(attempt.token)
        assert idem.current_attempt() is attempt
        return {"order": 7, "token": attempt.token}

    first = executor.run(scope, "k", action)
    assert not first.replayed
    assert first.token == calls[0] and first.attempt == 1 and first.stolen is False
    assert first.value == {"order": 7, "token": first.token}
    assert first.completed_at is None

    again = executor.run(scope, "k", action)
    assert again.replayed
    assert again.value == first.value
    assert calls == [first.token]  # the action did not run again
    assert again.token is None and again.attempt == 0
    assert isinstance(again.completed_at, datetime.datetime)
    assert again.completed_at.tzinfo is not None
    assert again.expires_at > again.completed_at
    assert idem.current_attempt() is None


def test_the_actions_own_exception_releases_the_key(executor, store, scope):
    boom = ValueError("card declined")

    def action(attempt):
        raise boom

    with pytest.raises(ValueError) as raised:
        executor.run(scope, "k", action)
    assert raised.value is boom  # the same object, unchanged
    assert store.get(scope, "k") is None  # released: no failed state
    r = executor.run(scope, "k", lambda a: "second")
    assert not r.replayed and r.attempt == 1 and not r.stolen and r.value == "second"


def test_keyboard_interrupt_in_the_action_also_releases(executor, store, scope):
    def action(attempt):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        executor.run(scope, "k", action)
    assert store.get(scope, "k") is None


def test_busy_key_raises_in_progress_from_this_and_another_executor(store, scope):
    owner = idem.Executor(store)
    other = idem.Executor(store)  # another process, as far as the store can tell
    try:
        attempt = owner.begin(scope, "k", lease=20)
        for ex in (owner, other):
            with pytest.raises(idem.InProgress) as e:
                ex.run(scope, "k", lambda a: pytest.fail("ran while the key was busy"))
            assert e.value.retryable and e.value.code == "in_progress"
            assert 0 < e.value.lease_remaining <= 20
            assert e.value.scope == scope and e.value.key == "k"
            assert isinstance(e.value.lease_expires_at, datetime.datetime)
        attempt.complete("done")
        assert other.run(scope, "k", lambda a: "again").value == "done"
    finally:
        owner.close(timeout=0)
        other.close(timeout=0)


@pytest.mark.parametrize("same_executor", [True, False])
def test_a_waiting_duplicate_gets_the_owners_result(store, scope, same_executor):
    owner = idem.Executor(store)
    waiter_ex = owner if same_executor else idem.Executor(store, initial_backoff=0.005)
    try:
        attempt = owner.begin(scope, "k")
        got = {}

        def waiter():
            got["r"] = waiter_ex.run(scope, "k", lambda a: "waiter ran", wait=30)

        t = threading.Thread(target=waiter)
        t.start()
        if same_executor:
            eventually(lambda: owner.waiting_duplicates == 1, "the duplicate to wait in memory")
        attempt.complete("owner's")
        t.join(30)
        assert not t.is_alive()
        assert got["r"].value == "owner's"
        if same_executor:
            # In memory: the owner's lease facts, no store call.
            assert got["r"].replayed and got["r"].token == attempt.token
        else:
            assert got["r"].replayed
    finally:
        owner.close(timeout=0)
        if not same_executor:
            waiter_ex.close(timeout=0)


def test_a_waiter_runs_itself_when_the_owner_releases(store, scope):
    owner = idem.Executor(store)
    waiter_ex = idem.Executor(store, initial_backoff=0.005)
    try:
        attempt = owner.begin(scope, "k")
        got = {}
        t = threading.Thread(
            target=lambda: got.setdefault("r", waiter_ex.run(scope, "k", lambda a: a.number, wait=30))
        )
        t.start()
        attempt.release()
        t.join(30)
        assert got["r"].value == 1 and not got["r"].replayed and not got["r"].stolen
    finally:
        owner.close(timeout=0)
        waiter_ex.close(timeout=0)


def test_waiting_ends_with_in_progress_when_the_bound_runs_out(store, scope):
    owner = idem.Executor(store)
    other = idem.Executor(store, initial_backoff=0.005, max_backoff=0.02)
    try:
        attempt = owner.begin(scope, "k")
        with pytest.raises(idem.InProgress):
            other.run(scope, "k", lambda a: "x", wait=0.1)
        assert attempt.active
    finally:
        owner.close(timeout=0)
        other.close(timeout=0)


def test_tokens_grow_for_a_key(executor, store, scope):
    tokens = []
    for _ in range(3):
        with executor.begin(scope, "k") as attempt:
            tokens.append(attempt.token)
            attempt.release()
    r = executor.run(scope, "k", lambda a: a.token)
    tokens.append(r.value)
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


def test_a_forgotten_record_loses_the_lease_and_complete_is_fenced(store, scope):
    # An operator deletes the record while the action runs: the heartbeat's extend is
    # fenced, the attempt learns it (flag and stop callback), and its result is refused.
    ex = idem.Executor(store, lease=0.6, heartbeat=0.05)
    try:
        attempt = ex.begin(scope, "k")
        stopped = threading.Event()
        attempt.add_stop_callback(stopped.set)
        assert store.forget(scope, "k")
        eventually(lambda: attempt.lease_lost, "the heartbeat to notice the lost lease")
        assert stopped.wait(30) and attempt.stop_requested
        with pytest.raises(idem.LeaseLost) as e:
            attempt.raise_if_lost()
        assert e.value.token == attempt.token
        with pytest.raises(idem.LeaseLost) as e:
            attempt.complete("too late")
        assert e.value.token == attempt.token and e.value.retryable
        assert store.get(scope, "k") is None  # nothing was recorded
    finally:
        ex.close(timeout=0)


def test_a_taken_over_key_fences_the_old_owner(store, scope):
    # The old owner's record is forgotten and a new owner takes the key: the old owner's
    # complete is fenced, the new owner's token is larger and its result stands.
    ex = idem.Executor(store, lease=0.6, heartbeat=0.05)
    other = idem.Executor(store)
    try:
        old = ex.begin(scope, "k")
        store.forget(scope, "k")
        new = other.begin(scope, "k")
        assert new.token > old.token
        eventually(lambda: old.lease_lost, "the old owner to learn its lease was lost")
        with pytest.raises(idem.LeaseLost):
            old.complete("old")
        new.complete("new")
        assert other.run(scope, "k", lambda a: "x").value == "new"
    finally:
        ex.close(timeout=0)
        other.close(timeout=0)


def test_after_forget_the_same_executor_acquires_as_another_would(store, scope):
    # Issue 36: the executor's memory of an in-process owner does not outlive its record: a
    # second caller in the same executor acquires at once, as one in another executor does.
    ex = idem.Executor(store, lease=60)
    try:
        first = ex.begin(scope, "k")
        assert store.forget(scope, "k")
        second = ex.begin(scope, "k")
        assert not second.replayed and second.token > first.token
        with pytest.raises(idem.LeaseLost):
            first.complete("old")
        second.complete("new")
        assert ex.run(scope, "k", lambda a: "x").value == "new"
    finally:
        ex.close(timeout=0)


def test_lease_lost_reads_true_after_complete_raised_lease_lost(store, scope):
    # docs/python.md: lease_lost is true when another caller took the key over. Here only
    # complete() can tell: the heartbeat (every 20 s) has not come round yet.
    ex = idem.Executor(store, lease=60)
    other = idem.Executor(store)
    try:
        attempt = ex.begin(scope, "k")
        store.forget(scope, "k")
        new = other.begin(scope, "k")
        assert not attempt.lease_lost  # nobody noticed yet
        with pytest.raises(idem.LeaseLost) as e:
            attempt.complete("late")
        assert e.value.token == attempt.token and not attempt.active
        assert attempt.lease_lost
        with pytest.raises(idem.LeaseLost):
            attempt.raise_if_lost()
        new.complete("new")
    finally:
        ex.close(timeout=0)
        other.close(timeout=0)


def test_lease_lost_reads_true_after_run_raised_lease_lost(store, scope):
    ex = idem.Executor(store, lease=60)
    other = idem.Executor(store)
    seen = []
    try:

        def action(attempt):
            seen.append(attempt)
            store.forget(scope, "k")
            other.begin(scope, "k").complete("theirs")
            return "mine"

        with pytest.raises(idem.LeaseLost):
            ex.run(scope, "k", action)
        assert seen[0].lease_lost
        assert ex.run(scope, "k", lambda a: "x").value == "theirs"
    finally:
        ex.close(timeout=0)
        other.close(timeout=0)


def test_begin_as_a_context_manager(executor, store, scope):
    with executor.begin(scope, "k") as attempt:
        assert not attempt.replayed and attempt.active and attempt.number == 1
        result = attempt.complete(b"\x00raw bytes")
        assert not attempt.active
    assert result.value == b"\x00raw bytes" and not result.replayed
    assert attempt.result is result

    with executor.begin(scope, "k") as again:
        assert again.replayed and again.value == b"\x00raw bytes"
        assert again.token is None and not again.active
        with pytest.raises(RuntimeError, match="replay"):
            again.complete("x")


def test_leaving_begin_by_an_exception_releases(executor, store, scope):
    with pytest.raises(KeyError):
        with executor.begin(scope, "k") as attempt:
            assert store.get(scope, "k")["state"] == "in_progress"
            raise KeyError("no")
    assert not attempt.active
    assert store.get(scope, "k") is None


def test_leaving_begin_without_completing_releases(executor, store, scope):
    with executor.begin(scope, "k"):
        pass
    assert store.get(scope, "k") is None


def test_a_dropped_attempt_releases(executor, store, scope):
    attempt = executor.begin(scope, "k")
    del attempt
    assert store.get(scope, "k") is None


def test_complete_twice_is_a_caller_bug(executor, scope):
    attempt = executor.begin(scope, "k")
    attempt.complete(1)
    with pytest.raises(RuntimeError):
        attempt.complete(2)


def test_fingerprints_refuse_key_reuse(executor, scope):
    executor.run(scope, "k", lambda a: "first", fingerprint="digest-1")
    assert executor.run(scope, "k", lambda a: "x", fingerprint="digest-1").replayed
    with pytest.raises(idem.KeyReuse) as e:
        executor.run(scope, "k", lambda a: "x", fingerprint="digest-2")
    assert e.value.stored_fingerprint == "digest-1"
    assert e.value.request_fingerprint == "digest-2"
    assert not e.value.retryable


def test_a_result_too_large_is_refused_and_released(store, scope):
    ex = idem.Executor(store, max_payload=1000)
    try:
        with pytest.raises(idem.PayloadTooLarge) as e:
            ex.run(scope, "k", lambda a: b"x" * 5000)
        assert e.value.size == 5001 and e.value.limit == 1000  # the codec's tag byte counts
        assert isinstance(e.value, idem.InvalidArgument) and e.value.argument == "payload"
        assert store.get(scope, "k") is None
    finally:
        ex.close(timeout=0)


def test_bad_inputs_name_the_input(executor, scope):
    with pytest.raises(idem.InvalidArgument) as e:
        executor.run("", "k", lambda a: 1)
    assert e.value.argument == "scope"
    with pytest.raises(idem.InvalidArgument) as e:
        executor.run(scope, b"k" * 1025, lambda a: 1)
    assert e.value.argument == "key"
    with pytest.raises(idem.InvalidArgument) as e:
        executor.run(scope, "k", lambda a: 1, ttl=0)
    assert e.value.argument == "ttl"
    with pytest.raises(TypeError, match="lease must be seconds"):
        executor.run(scope, "k", lambda a: 1, lease="30s")
    with pytest.raises(idem.InvalidArgument):
        idem.Executor("memory:", heartbeat=60, lease=30)


def test_keys_are_bytes_or_str(executor, scope):
    executor.run(scope, b"\x00\xffbinary", lambda a: "b")
    assert executor.run(scope, b"\x00\xffbinary", lambda a: "x").value == "b"
    executor.run(scope, "ключ", lambda a: "s")
    assert executor.run(scope, "ключ".encode(), lambda a: "x").value == "s"


def test_durations_take_timedelta(executor, scope):
    r = executor.run(scope, "k", lambda a: 1, ttl=datetime.timedelta(minutes=5), lease=2.5)
    assert r.value == 1
    again = executor.run(scope, "k", lambda a: 2)
    delta = again.expires_at - again.completed_at
    assert datetime.timedelta(minutes=4) < delta <= datetime.timedelta(minutes=5, seconds=1)


def test_close_refuses_new_calls(store, scope):
    ex = idem.Executor(store)
    with ex:
        assert ex.run(scope, "k", lambda a: 1).value == 1
    assert ex.is_shut_down
    with pytest.raises(idem.ShutDown):
        ex.run(scope, "k2", lambda a: 1)


def test_close_releases_open_attempts(store, scope):
    ex = idem.Executor(store)
    attempt = ex.begin(scope, "k")
    ex.close(timeout=0)
    assert attempt.stop_requested
    with pytest.raises(idem.LeaseLost, match="shut down"):
        attempt.complete("late")
    assert store.get(scope, "k") is None


def test_events_reach_on_event(store, scope):
    events = []
    ex = idem.Executor(store, on_event=events.append)
    try:
        ex.run(scope, "k", lambda a: 1)
        ex.run(scope, "k", lambda a: 1)
        with pytest.raises(ZeroDivisionError):
            ex.run(scope, "k2", lambda a: 1 / 0)
        kinds = [e.kind for e in events]
        assert kinds == ["ran", "replayed", "released"]
        assert events[0].scope == scope and events[0].key == "k" and events[0].token > 0
        assert events[0].elapsed >= 0
    finally:
        ex.close(timeout=0)


def test_an_unreachable_store_is_an_error_not_a_crash():
    with pytest.raises(idem.StoreUnavailable) as e:
        idem.Executor("redis://127.0.0.1:1/0?connect_timeout=200")
    assert e.value.retryable and "127.0.0.1" in e.value.store
    with pytest.raises(idem.InvalidArgument) as e:
        idem.open_store("nosuch://x")
    assert e.value.argument == "store URL"


def test_a_password_never_shows(tmp_path):
    with pytest.raises(idem.StoreUnavailable) as e:
        idem.open_store("redis://user:s3cret@127.0.0.1:1/0?connect_timeout=200")
    assert "s3cret" not in str(e.value) and "s3cret" not in e.value.store
