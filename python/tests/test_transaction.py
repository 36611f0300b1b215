"""SPEC §14 is not built yet (issue 22): the seam refuses clearly; the libpq pointer of a
psycopg connection is reachable."""

from __future__ import annotations

import pytest

import idem
from conftest import server_url
from idem import transaction


def test_the_libpq_pointer_of_a_psycopg_connection():
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(server_url("postgres")) as conn:
        pointer = transaction.libpq_connection_pointer(conn)
        assert isinstance(pointer, int) and pointer != 0
        assert pointer == conn.pgconn.pgconn_ptr
    with pytest.raises(ValueError, match="closed"):
        transaction.libpq_connection_pointer(conn)
    with pytest.raises(TypeError):
        transaction.libpq_connection_pointer(object())


def test_completion_in_the_callers_transaction_is_refused_until_issue_22(executor, scope):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(server_url("postgres")) as conn:
        with executor.begin(scope, "k") as attempt:
            with pytest.raises(NotImplementedError, match="issue 22"):
                transaction.complete_in_transaction(attempt, conn, "value")
            assert attempt.active  # nothing was recorded, the lease is still held
