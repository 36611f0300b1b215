"""idem: run an action at most once per (scope, key), for Python services.

A CPython extension over the idem C++ library, with the same stores and the same store
URLs (docs/python.md is the guide)::

    import idem

    executor = idem.Executor("sqlite:///var/lib/app/idem.db")
    r = executor.run("payments", request_id, lambda attempt: charge(card, attempt.token))
    if r.replayed:
        ...  # a duplicate: the first run's result; charge() did not run
"""

from __future__ import annotations

import atexit as _atexit

from . import _idem, errors
from ._decorator import idempotent
from ._executor import AsyncAttempt, Executor, current_attempt, open_store
from ._idem import Attempt, DefaultCodec, Event, Result, Store, available_schemes
from .codecs import BytesCodec, Codec, JsonCodec, StrCodec
from .errors import (
    DecodeFailed,
    Error,
    InProgress,
    InvalidArgument,
    KeyReuse,
    LeaseLost,
    PayloadTooLarge,
    ShutDown,
    StoreUnavailable,
)

__version__: str = _idem.__version__

_idem._set_error_classes({name: getattr(errors, name) for name in errors.__all__})
# At interpreter exit, before finalization: executors release the leases of attempts still
# open (so the next process finds the keys free), and the library's threads stop calling
# into Python (gil.h says why).
_atexit.register(_idem._at_exit)

__all__ = [
    "Executor",
    "Attempt",
    "AsyncAttempt",
    "Result",
    "Event",
    "Store",
    "open_store",
    "available_schemes",
    "idempotent",
    "current_attempt",
    "Codec",
    "DefaultCodec",
    "BytesCodec",
    "StrCodec",
    "JsonCodec",
    "Error",
    "InvalidArgument",
    "PayloadTooLarge",
    "InProgress",
    "KeyReuse",
    "LeaseLost",
    "StoreUnavailable",
    "DecodeFailed",
    "ShutDown",
]
