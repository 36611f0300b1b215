"""Several Python processes over one store (SQLite, PostgreSQL, Redis): every key runs once;
a crashed owner's lease is taken over; a paused owner is fenced."""

from __future__ import annotations

import collections
import signal
import time

import pytest

import idem
from conftest import spawn

PROCESSES = 4
KEYS = 40


def test_processes_racing_the_same_keys_run_each_once(shared_url, scope, tmp_path):
    runs = tmp_path / "runs.txt"
    runs.touch()
    workers = [spawn("worker.py", shared_url, scope, str(KEYS), str(runs)) for _ in range(PROCESSES)]
    outputs = [w.communicate(timeout=120) for w in workers]
    for w, (out, err) in zip(workers, outputs):
        assert w.returncode == 0, err
    lines = runs.read_text().split()
    per_key = collections.Counter(lines[0::3])
    assert sorted(per_key) == sorted(f"k{i}" for i in range(KEYS))
    assert set(per_key.values()) == {1}, [k for k, n in per_key.items() if n > 1]
    replays = sum(int(out.split()[1]) for out, _ in outputs)
    assert replays == KEYS * (PROCESSES - 1)


def test_a_crashed_owners_lease_is_taken_over(shared_url, scope):
    holder = spawn("hold.py", shared_url, scope, "k", "os_exit")
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    old_token = int(out.split()[1])
    ex = idem.Executor(shared_url, initial_backoff=0.01)
    try:
        # The crashed process never released: the key stays busy until its 0.5 s lease runs out.
        r = ex.run(scope, "k", lambda a: (a.number, a.stolen, a.token), wait=30)
        number, stolen, token = r.value
        assert (number, stolen) == (2, True) and token > old_token
        assert r.stolen and r.attempt == 2
    finally:
        ex.close(timeout=0)


def test_a_paused_owner_is_fenced_after_a_takeover(shared_url, scope):
    # The owner stops (SIGSTOP: a long GC pause, a frozen VM) past its lease; another
    # process takes the key over and completes. Woken up, the old owner learns that its
    # lease was lost and its complete is refused.
    holder = spawn("hold.py", shared_url, scope, "k", "pause", stdin=-1)
    line = holder.stdout.readline()
    old_token = int(line.split()[1])
    holder.send_signal(signal.SIGSTOP)
    ex = idem.Executor(shared_url, initial_backoff=0.01)
    try:
        r = ex.run(scope, "k", lambda a: "new owner", wait=30)
        assert r.stolen and r.token > old_token
    finally:
        holder.send_signal(signal.SIGCONT)
    time.sleep(0.2)  # let its heartbeat see the fenced extend first
    out, err = holder.communicate("go\n", timeout=60)
    assert out.startswith(f"LeaseLost token={old_token}"), (out, err)
    assert ex.run(scope, "k", lambda a: "x").value == "new owner"
    ex.close(timeout=0)
