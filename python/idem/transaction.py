"""Completion inside the caller's own PostgreSQL transaction (SPEC §14, docs/python.md).

When the application's data lives in the PostgreSQL database that holds the store's
records, the COMPLETE record can be written on the application's psycopg connection, inside
its open transaction, so that the application's writes and the record commit together or
not at all: a crash between two commits can no longer leave the writes committed and the
key IN_PROGRESS for the next caller to run again.

    with executor.begin(scope, key) as attempt:
        if attempt.replayed:
            return attempt.value
        with conn.transaction():
            conn.execute("INSERT INTO orders ...")
            complete_in_transaction(attempt, conn, {"order": 42})
        attempt.committed()

or in one call, :func:`run_in_transaction`. The store must be a ``postgresql://`` store on
that database; other stores refuse with :class:`idem.InvalidArgument`.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["libpq_connection_pointer", "complete_in_transaction", "run_in_transaction"]


def libpq_connection_pointer(connection: Any) -> int:
    """The address of the ``PGconn`` behind a psycopg 3 connection (``conn.pgconn.pgconn_ptr``)
    or a psycopg2 one (``conn.pgconn_ptr``, psycopg2 2.8+). Raises TypeError for anything else
    and ValueError for a closed connection."""
    pgconn = getattr(connection, "pgconn", None)
    pointer = getattr(pgconn, "pgconn_ptr", None) if pgconn is not None else None
    if pointer is None:
        pointer = getattr(connection, "pgconn_ptr", None)
    if pointer is None and pgconn is None and not hasattr(connection, "pgconn_ptr"):
        raise TypeError(
            f"not a psycopg connection: {type(connection).__name__} (psycopg 3 or psycopg2 2.8+)"
        )
    if not pointer:
        raise ValueError("the connection is closed: it has no libpq connection")
    return int(pointer)


def complete_in_transaction(attempt: Any, connection: Any, value: Any) -> None:
    """Writes ``value`` as the attempt's COMPLETE record inside ``connection``'s open
    transaction. Nothing is visible until the caller commits; then report the outcome with
    ``attempt.committed()`` (returns the Result), ``attempt.rolled_back()`` (the lease is held
    again), or ``attempt.resolve()`` when the COMMIT's answer was lost (the Result, or None).
    Raises :class:`idem.LeaseLost` when the lease was lost (roll back: nothing was written),
    :class:`idem.InvalidArgument` for a store that cannot join the transaction or a
    connection outside one."""
    attempt._complete_in(libpq_connection_pointer(connection), value)


def run_in_transaction(executor: Any, connection: Any, scope: Any, key: Any,
                       fn: Callable[[Any], Any]) -> Any:
    """``executor.run(scope, key, fn)`` whose result commits with ``fn``'s own writes on
    ``connection`` (a psycopg 3 connection, not in a transaction): the lease, then
    ``connection.transaction()`` around ``fn(attempt)`` and the COMPLETE record. Returns the
    Result (``replayed`` for a duplicate). If ``fn`` raises, the transaction rolls back and
    the key is released; if the COMMIT fails or its answer is lost, the record says whether
    it happened."""
    with executor.begin(scope, key) as attempt:
        if attempt.replayed:
            return attempt.result
        try:
            with connection.transaction():
                value = fn(attempt)
                complete_in_transaction(attempt, connection, value)
        except BaseException:
            if attempt.completing:
                outcome = attempt.resolve()
                if outcome is not None:
                    return outcome
            raise
        return attempt.committed()
