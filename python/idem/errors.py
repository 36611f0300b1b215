"""The errors of idem (SPEC §11), mirroring idem::Error in the C++ library.

Every error is an :class:`Error` with

- ``code``: ``"invalid_argument"``, ``"payload_too_large"``, ``"in_progress"``,
  ``"key_reuse"``, ``"lease_lost"``, ``"store_unavailable"``, ``"decode_failed"`` or
  ``"shut_down"``;
- ``retryable``: whether the same call can succeed later;
- ``scope`` and ``key``: the record it is about (``str`` when the bytes are valid UTF-8,
  else ``bytes``), or ``None`` when it is about an input or the executor;

and the facts of its kind as attributes. Expected outcomes (a replay, a busy key in
``Executor.begin`` with waiting) are never errors. The action's own exception reaches the
caller unchanged, after the key was released.
"""

from __future__ import annotations

import datetime
from typing import Optional, Union

__all__ = [
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


class Error(Exception):
    """Base of every idem error."""

    code: str = "error"
    retryable: bool = False
    scope: Optional[Union[str, bytes]] = None
    key: Optional[Union[str, bytes]] = None


class InvalidArgument(Error, ValueError):
    """An input breaks SPEC §10 (``argument`` names it). Fix the call; retrying fails the
    same way."""

    code = "invalid_argument"
    argument: str = ""


class PayloadTooLarge(InvalidArgument):
    """The encoded result (``size`` bytes) is larger than ``max_payload`` (``limit``); the
    record was released, so a retry starts clean. Store less, or raise the limit."""

    code = "payload_too_large"
    size: int = 0
    limit: int = 0


class InProgress(Error):
    """A live lease holds the key and the waiting bound ran out. Retry after
    ``lease_remaining`` seconds, or answer "409 Conflict"."""

    code = "in_progress"
    retryable = True
    lease_expires_at: Optional[datetime.datetime] = None
    lease_remaining: float = 0.0


class KeyReuse(Error):
    """The key was used before with a different fingerprint (a different request). A client
    bug: do not retry."""

    code = "key_reuse"
    stored_fingerprint: Union[str, bytes] = ""
    request_fingerprint: Union[str, bytes] = ""


class LeaseLost(Error):
    """The lease (``token``) was lost: the result was **not** recorded, another caller owns
    the key now. A retry replays whoever completed it, or runs again."""

    code = "lease_lost"
    retryable = True
    token: int = 0


class StoreUnavailable(Error, ConnectionError):
    """The store (``store``, its URL without a password) could not be reached or failed
    (``reason``). Retry later; when raised by begin or run, the action did not run."""

    code = "store_unavailable"
    retryable = True
    store: str = ""
    reason: str = ""


class DecodeFailed(Error):
    """The codec could not decode a stored result (``data``); the codec's own exception is
    ``__cause__``. The record is intact: fix the codec, or forget the record."""

    code = "decode_failed"
    data: bytes = b""
    reason: str = ""


class ShutDown(Error):
    """The executor is shutting down (or closed) and refuses the call."""

    code = "shut_down"
    retryable = True
