"""A process that exits with an attempt open, or with threads inside idem, exits at once
(no deadlock at interpreter shutdown, no crash of the heartbeat thread) and releases its
keys, so the next process finds them free."""

from __future__ import annotations

import pytest

import idem
from conftest import spawn, store_url


@pytest.mark.parametrize("mode", ["exit", "busy_exit"])
def test_exiting_with_an_open_attempt_releases_it(shared_url, scope, mode):
    holder = spawn("hold.py", shared_url, scope, "k", mode)
    # A hang guard, not a speed assertion: exiting must not wait for anything.
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert "Fatal" not in err and "terminate" not in err and "Traceback" not in err, err
    store = idem.open_store(shared_url)
    assert store.get(scope, "k") is None  # released at exit, not left to expire
    if mode == "busy_exit":
        assert store.get(scope, "k-run") is None
    ex = idem.Executor(store)
    r = ex.run(scope, "k", lambda a: (a.number, a.stolen))
    assert r.value == (1, False)
    ex.close(timeout=0)


def test_exiting_with_an_open_attempt_on_the_memory_store(tmp_path, scope):
    holder = spawn("hold.py", "memory:", scope, "k", "busy_exit")
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert "exiting" in out and "Fatal" not in err, err
