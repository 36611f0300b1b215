"""SPEC §14 from Python: the COMPLETE record commits in the caller's own psycopg transaction."""

from __future__ import annotations

import uuid

import pytest

import idem
from conftest import server_url
from idem import transaction

psycopg = pytest.importorskip("psycopg")


def test_the_libpq_pointer_of_a_psycopg_connection():
    with psycopg.connect(server_url("postgres")) as conn:
        pointer = transaction.libpq_connection_pointer(conn)
        assert isinstance(pointer, int) and pointer != 0
        assert pointer == conn.pgconn.pgconn_ptr
    with pytest.raises(ValueError, match="closed"):
        transaction.libpq_connection_pointer(conn)
    with pytest.raises(TypeError):
        transaction.libpq_connection_pointer(object())


@pytest.fixture
def pg():
    """An executor on the test PostgreSQL, a psycopg connection to the same database and an
    effects table of the application's."""
    table = "idem_py_tx_" + uuid.uuid4().hex[:12]
    url = server_url("postgres")
    executor = idem.Executor(url + ("&" if "?" in url else "?") + "table=" + table)
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f"CREATE TABLE {table}_effects (k text)")
    yield executor, conn, table + "_effects"
    conn.execute(f"DROP TABLE IF EXISTS {table}_effects")
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.close()
    executor.close(timeout=0)


def count(conn, effects, key):
    return conn.execute(f"SELECT count(*) FROM {effects} WHERE k = %s", (key,)).fetchone()[0]


def test_commit_records_the_result_with_the_effects(pg):
    executor, conn, effects = pg
    with executor.begin("s", "k1") as attempt:
        with conn.transaction():
            conn.execute(f"INSERT INTO {effects} VALUES ('k1')")
            transaction.complete_in_transaction(attempt, conn, {"order": 1})
            assert attempt.completing
        result = attempt.committed()
    assert result.value == {"order": 1} and not result.replayed
    assert count(conn, effects, "k1") == 1
    again = executor.run("s", "k1", lambda a: pytest.fail("ran twice"))
    assert again.replayed and again.value == {"order": 1}


def test_rollback_keeps_the_lease_and_writes_nothing(pg):
    executor, conn, effects = pg
    with executor.begin("s", "k2") as attempt:
        with pytest.raises(RuntimeError):
            with conn.transaction():
                conn.execute(f"INSERT INTO {effects} VALUES ('k2')")
                transaction.complete_in_transaction(attempt, conn, "v")
                raise RuntimeError("the application changed its mind")
        attempt.rolled_back()
        assert attempt.active and not attempt.completing
        record = executor.store.get("s", "k2")
        assert record["state"] == "in_progress" and record["token"] == attempt.token
        assert attempt.complete("plain").value == "plain"
    assert count(conn, effects, "k2") == 0


def test_resolve_reads_a_lost_commit_from_the_record(pg):
    executor, conn, effects = pg
    with executor.begin("s", "k3") as attempt:
        with conn.transaction():
            conn.execute(f"INSERT INTO {effects} VALUES ('k3')")
            transaction.complete_in_transaction(attempt, conn, "three")
        result = attempt.resolve()  # as if the COMMIT's answer had been lost
    assert result is not None and result.value == "three"


def test_run_in_transaction_runs_once_and_rolls_back_a_failure(pg):
    executor, conn, effects = pg
    runs = []

    def action(attempt):
        runs.append(attempt.token)
        conn.execute(f"INSERT INTO {effects} VALUES ('k4')")
        return "four"

    first = transaction.run_in_transaction(executor, conn, "s", "k4", action)
    second = transaction.run_in_transaction(executor, conn, "s", "k4", action)
    assert (first.value, first.replayed) == ("four", False)
    assert (second.value, second.replayed) == ("four", True)
    assert len(runs) == 1 and count(conn, effects, "k4") == 1

    def failing(attempt):
        conn.execute(f"INSERT INTO {effects} VALUES ('k5')")
        raise ValueError("boom")

    with pytest.raises(ValueError):
        transaction.run_in_transaction(executor, conn, "s", "k5", failing)
    assert count(conn, effects, "k5") == 0
    assert executor.store.get("s", "k5") is None


def test_a_store_that_cannot_join_refuses(executor, scope):
    if executor.store.describe().startswith("postgresql"):
        pytest.skip("this store can join")
    with psycopg.connect(server_url("postgres")) as conn:
        with executor.begin(scope, "k") as attempt:
            with conn.transaction():
                with pytest.raises(idem.InvalidArgument, match="cannot join|keeps its records elsewhere"):
                    transaction.complete_in_transaction(attempt, conn, "value")
            assert attempt.active  # nothing was recorded, the lease is still held
