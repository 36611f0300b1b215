"""Completion inside the caller's own database transaction (SPEC §14): **not available yet**.

SPEC §14 lets a caller whose data lives in the store's own database record the result in
its open transaction, so that its effects and the COMPLETE record commit together. The C++
library does not offer it yet (issue 22: "Transactional completion"); when it does, this
module will hand it a psycopg connection's libpq pointer, which
:func:`libpq_connection_pointer` already extracts, and :func:`complete_in_transaction`
will run the fenced write on that connection. Until then it raises NotImplementedError;
nothing here pretends to commit atomically.
"""

from __future__ import annotations

from typing import Any

__all__ = ["libpq_connection_pointer", "complete_in_transaction"]


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
    """Records ``value`` inside ``connection``'s open transaction (SPEC §14). Not available:
    the C++ library has no completion on the caller's connection yet (issue 22). Raises
    NotImplementedError; use ``attempt.complete(value)`` after your own commit meanwhile."""
    libpq_connection_pointer(connection)  # the part that exists: refuse a non-psycopg object
    raise NotImplementedError(
        "idem: completion inside the caller's transaction (SPEC §14) needs the C++ library's "
        "transactional completion (issue 22), which is not built yet; commit your transaction, "
        "then call attempt.complete(value)"
    )
