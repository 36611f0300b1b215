"""An ASGI middleware with the contract of ``idem proxy``, in-process (SPEC §13).

::

    from starlette.applications import Starlette
    from idem.asgi import IdempotencyMiddleware

    executor = idem.Executor("redis://cache:6379/0")
    app = Starlette(routes=...)
    app.add_middleware(IdempotencyMiddleware, executor=executor)

A POST or PATCH with an ``Idempotency-Key`` header runs once; its answer is recorded and a
retry gets it back, byte for byte, with ``Idempotent-Replayed: true``, without running the
handler. A retry while the first is running gets 409 with ``Retry-After`` (or waits, with
``wait``); the same key on a different request gets 422; a malformed key 400. The handler
sees the lease as ``request.state.idempotency`` (an :class:`idem.AsyncAttempt`: its
``token`` is the fencing token) and in the headers ``Idempotency-Token``,
``Idempotency-Attempt`` and ``Idempotency-Stolen``, as behind the proxy. docs/python.md,
"ASGI middleware", has every answer.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from http import HTTPStatus
from typing import Any, Awaitable, Callable, Iterable, List, Optional, Sequence, Tuple, Union

from ._executor import Executor
from .codecs import BytesCodec
from .errors import (
    InProgress,
    InvalidArgument,
    KeyReuse,
    LeaseLost,
    PayloadTooLarge,
    ShutDown,
    StoreUnavailable,
)

__all__ = ["IdempotencyMiddleware", "encode_record", "decode_record"]

Scope = dict
Message = dict
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = List[Tuple[bytes, bytes]]

_MAX_KEY_BYTES = 1024
_MAX_SCOPE_BYTES = 255
# Not recorded, as in the proxy: hop-by-hop headers, and Content-Length (a replay sets it).
_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"content-length",
}
# Headers the middleware sets for the handler; a client's are removed.
_FENCING = (b"idempotency-token", b"idempotency-attempt", b"idempotency-stolen")

# --- the record format: the proxy's (docs/proxy.md, "Record format") ---

_MAGIC = b"IDMH"
_VERSION = 1
# Flags: 0 is a whole answer. FLAG_TOO_LARGE: the answer ran but was larger than
# max_record; only its status is kept and a retry is refused with 409 (never run again).
FLAG_TOO_LARGE = 0x01


def encode_record(status: int, headers: Sequence[Tuple[bytes, bytes]], body: bytes, flags: int = 0) -> bytes:
    """An answer in the proxy's record format, version 1 (every integer big-endian)."""
    reason = _reason(status).encode("latin-1")
    out = [_MAGIC, struct.pack(">BBHH", _VERSION, flags, status, len(reason)), reason]
    kept = [(n, v) for n, v in headers if n.lower() not in _HOP_BY_HOP]
    out.append(struct.pack(">I", len(kept)))
    for name, value in kept:
        out += [struct.pack(">I", len(name)), name, struct.pack(">I", len(value)), value]
    out.append(body)
    return b"".join(out)


def decode_record(data: bytes) -> Tuple[int, int, Headers, bytes]:
    """(flags, status, headers, body) of a record; ValueError for anything else."""
    if len(data) < 10 or data[:4] != _MAGIC:
        raise ValueError("not a recorded HTTP answer")
    version, flags, status, reason_len = struct.unpack_from(">BBHH", data, 4)
    if version != _VERSION or flags & ~FLAG_TOO_LARGE:
        raise ValueError(f"a recorded answer of an unknown version {version} or flags {flags}")
    at = 10 + reason_len
    (count,) = struct.unpack_from(">I", data, at)
    at += 4
    headers: Headers = []
    for _ in range(count):
        (n,) = struct.unpack_from(">I", data, at)
        name = data[at + 4 : at + 4 + n]
        at += 4 + n
        (n,) = struct.unpack_from(">I", data, at)
        value = data[at + 4 : at + 4 + n]
        at += 4 + n
        headers.append((name, value))
    if at > len(data):
        raise ValueError("a truncated recorded answer")
    return flags, status, headers, data[at:]


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


# --- identity (docs/proxy.md, "Identity") ---


def read_key(values: List[bytes]) -> Tuple[Optional[str], Optional[str]]:
    """(key, None), or (None, why) for a malformed header. RFC 8941 string or a token."""
    if len(values) > 1:
        return None, "the request has more than one Idempotency-Key header"
    value = values[0].strip(b" \t")
    if value.startswith(b'"'):
        out = bytearray()
        i, closed = 1, False
        while i < len(value):
            c = value[i]
            if c == 0x5C:  # backslash
                if i + 1 >= len(value) or value[i + 1] not in (0x22, 0x5C):
                    return None, 'the Idempotency-Key string has an escape other than \\" or \\\\'
                out.append(value[i + 1])
                i += 2
                continue
            if c == 0x22:
                closed = True
                i += 1
                break
            if c < 0x20 or c > 0x7E:
                return None, "the Idempotency-Key string holds a byte that is not printable ASCII"
            out.append(c)
            i += 1
        if not closed:
            return None, "the Idempotency-Key string has no closing quote"
        if i != len(value):
            return None, "the Idempotency-Key header has something after the closing quote"
        key = bytes(out)
    else:
        if any(c <= 0x20 or c > 0x7E for c in value):
            return None, "the Idempotency-Key is neither a quoted string nor a token of visible ASCII"
        key = value
    if not key:
        return None, "the Idempotency-Key is empty"
    if len(key) > _MAX_KEY_BYTES:
        return None, f"the Idempotency-Key is {len(key)} bytes, more than the limit of {_MAX_KEY_BYTES}"
    return key.decode("ascii"), None


def _cookie(headers: Headers, name: bytes) -> Optional[bytes]:
    for n, v in headers:
        if n != b"cookie":
            continue
        for pair in v.split(b";"):
            k, eq, val = pair.strip(b" \t").partition(b"=")
            if eq and k.strip(b" \t") == name:
                return val.strip(b" \t")
    return None


def _field(h: "hashlib._Hash", data: bytes) -> None:
    h.update(struct.pack(">Q", len(data)))
    h.update(data)


class IdempotencyMiddleware:
    """Applies idem to the keyed requests of an ASGI application (SPEC §13).

    Options, as the proxy's flags of the same names (docs/proxy.md):

    - ``executor``: the :class:`idem.Executor` (its store is where answers are recorded).
    - ``methods`` (POST, PATCH): methods whose keyed requests go through idem.
    - ``require_key`` (False): answer 400 to a request of those methods without a key.
    - ``scope``: a fixed scope instead of the method and path.
    - ``scope_header``: a header whose value leads the scope (a tenant).
    - ``credential_scope`` (True): a digest of ``Authorization`` (else of the
      ``credential_cookies``) joins the scope, so one client never gets another's answer.
    - ``credential_cookies`` (none): cookies that identify the caller.
    - ``fingerprint_headers`` (none): headers whose values join the fingerprint.
    - ``release_status`` (5xx, 429, 408): statuses (ints, or "5xx" style strings) that
      release the record instead of recording it: the request did not run.
    - ``wait`` (0): how long a duplicate of a request in flight waits for its answer.
    - ``lease``, ``ttl``: per-request lease and retention (default: the executor's).
    - ``max_request_body`` (1 MiB): larger keyed requests get 413.
    - ``max_record`` (1 MiB): larger answers stream through once, with
      ``Idempotency-Not-Recorded: too-large``; a marker is recorded so that a retry gets
      409 ``not-replayable`` instead of running again.
    """

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        executor: Executor,
        *,
        methods: Iterable[str] = ("POST", "PATCH"),
        require_key: bool = False,
        scope: Optional[str] = None,
        scope_header: Optional[str] = None,
        credential_scope: bool = True,
        credential_cookies: Iterable[str] = (),
        fingerprint_headers: Iterable[str] = (),
        release_status: Iterable[Union[int, str]] = ("5xx", 429, 408),
        wait: Optional[float] = None,
        lease: Optional[float] = None,
        ttl: Optional[float] = None,
        max_request_body: int = 1 << 20,
        max_record: int = 1 << 20,
    ) -> None:
        self.app = app
        self.executor = executor
        self.methods = {m.upper() for m in methods}
        self.require_key = require_key
        if scope is not None:
            if not isinstance(scope, str):
                raise TypeError(f"scope must be str, not {type(scope).__name__}")
            try:
                scope.encode("utf-8")
            except UnicodeEncodeError as e:
                # As Executor.run says of such a scope (a str with a lone surrogate).
                error = InvalidArgument(
                    f"invalid scope: a str must encode as UTF-8, and this one holds the lone "
                    f"surrogate U+{ord(scope[e.start]):04X} at index {e.start}"
                )
                error.argument = "scope"
                raise error from e
        self.fixed_scope = scope
        self.scope_header = scope_header.lower().encode("latin-1") if scope_header else None
        self.credential_scope = credential_scope
        self.credential_cookies = [c.encode("latin-1") for c in credential_cookies]
        self.fingerprint_headers = [h.lower().encode("latin-1") for h in fingerprint_headers]
        self.release = _status_set(release_status)
        self.max_request_body = max_request_body
        self.max_record = max_record
        self.options: dict = {"codec": BytesCodec()}
        # Checked now, not on the first keyed request: a bad value raises here, naming it.
        executor._check_call_options(wait=wait, lease=lease, ttl=ttl)
        for name, value in (("wait", wait), ("lease", lease), ("ttl", ttl)):
            if value is not None:
                self.options[name] = value

    # --- identity ---

    def scope_of(self, scope: Scope, headers: Headers) -> Tuple[str, bool]:
        """The record's scope, and whether it holds a credential:

        ``[t<len>:<scope header> ][c:<sha256 of credentials> ]h<len>:<host> <METHOD> <path>``
        """
        parts: List[bytes] = []
        if self.scope_header is not None:
            for n, v in headers:
                if n == self.scope_header:
                    parts.append(b"t%d:" % len(v) + v + b" ")
                    break
        credential = False
        if self.credential_scope:
            creds = b"".join(b"authorization\n" + v + b"\n" for n, v in headers if n == b"authorization")
            if not creds:
                for name in self.credential_cookies:
                    value = _cookie(headers, name)
                    if value is not None:
                        creds += b"cookie\n" + name + b"=" + value + b"\n"
            if creds:
                credential = True
                parts.append(b"c:" + hashlib.sha256(creds).hexdigest().encode("ascii") + b" ")
        host = next((v for n, v in headers if n == b"host"), None)
        if host is None:
            server = scope.get("server") or ("", None)
            host = (f"{server[0]}:{server[1]}" if server[1] else str(server[0])).encode("latin-1")
        host = host.lower()
        parts.append(b"h%d:" % len(host) + host + b" ")
        if self.fixed_scope is not None:
            parts.append(self.fixed_scope.encode("utf-8"))
        else:
            path = scope.get("raw_path") or scope["path"].encode("utf-8")
            parts.append(scope["method"].encode("ascii") + b" " + path.split(b"?", 1)[0])
        out = b"".join(parts)
        if len(out) > _MAX_SCOPE_BYTES:
            return "sha256:" + hashlib.sha256(out).hexdigest(), credential
        return out.decode("latin-1"), credential

    def fingerprint_of(self, scope: Scope, headers: Headers, body: bytes) -> str:
        """SHA-256 over the method, target, body and the fingerprint headers' values."""
        h = hashlib.sha256()
        target = scope.get("raw_path") or scope["path"].encode("utf-8")
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        _field(h, scope["method"].encode("ascii"))
        _field(h, target)
        _field(h, body)
        for name in self.fingerprint_headers:
            _field(h, b"".join(v + b"\n" for n, v in headers if n == name))
        return h.hexdigest()

    # --- the request ---

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"].upper() not in self.methods:
            await self.app(scope, receive, send)
            return
        headers: Headers = [(n.lower(), v) for n, v in scope["headers"]]
        values = [v for n, v in headers if n == b"idempotency-key"]
        if not values:
            if self.require_key:
                await _problem(send, 400, "missing-key", "this request needs an Idempotency-Key header")
                return
            await self.app(scope, receive, send)
            return
        key, why = read_key(values)
        if key is None:
            await _problem(send, 400, "bad-key", why or "malformed Idempotency-Key")
            return
        body = await _read_body(receive, self.max_request_body)
        if body is None:
            await _problem(send, 413, "body-too-large", "the request body is too large")
            return
        record_scope, credential = self.scope_of(scope, headers)
        fingerprint = self.fingerprint_of(scope, headers, body)
        try:
            attempt = await self.executor.begin_async(
                record_scope, key, fingerprint=fingerprint, **self.options
            )
        except KeyReuse:
            await _problem(
                send, 422, "key-reuse",
                "this Idempotency-Key was used before with a different request (method, target "
                "or body); use a new key for a new request",
            )
            return
        except InProgress as e:
            await _problem(
                send, 409, "in-progress",
                "a request with this Idempotency-Key is in progress; retry after the time in "
                "Retry-After",
                [(b"retry-after", str(max(1, math.ceil(e.lease_remaining))).encode("ascii"))],
            )
            return
        except (StoreUnavailable, ShutDown):
            await _problem(
                send, 503, "store-unavailable", "the idempotency store cannot be reached; retry later",
                [(b"retry-after", b"1")],
            )
            return
        if attempt.replayed:
            await self._replay(send, attempt.value, credential)
            return
        await self._run(scope, headers, body, receive, send, attempt)

    async def _replay(self, send: Send, record: bytes, credential: bool) -> None:
        try:
            flags, status, headers, body = decode_record(record)
        except (ValueError, struct.error):
            await _problem(
                send, 500, "foreign-record",
                "the record under this Idempotency-Key was not written by this service",
            )
            return
        if flags & FLAG_TOO_LARGE:
            await _problem(
                send, 409, "not-replayable",
                "the request with this Idempotency-Key ran, but its answer was too large to "
                "record; it will not run again",
            )
            return
        if not credential:
            # SPEC §13: an answer that sets a cookie is never handed to a request with no
            # credential in its scope (it could be anybody's).
            headers = [(n, v) for n, v in headers if n.lower() != b"set-cookie"]
        headers = headers + [
            (b"content-length", str(len(body)).encode("ascii")),
            (b"idempotent-replayed", b"true"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _run(
        self, scope: Scope, headers: Headers, body: bytes, receive: Receive, send: Send, attempt: Any
    ) -> None:
        inner = dict(scope)
        inner["headers"] = [(n, v) for n, v in scope["headers"] if n.lower() not in _FENCING] + [
            (b"idempotency-token", str(attempt.token).encode("ascii")),
            (b"idempotency-attempt", str(attempt.number).encode("ascii")),
            (b"idempotency-stolen", b"true" if attempt.stolen else b"false"),
        ]
        state = dict(scope.get("state") or {})
        state["idempotency"] = attempt
        inner["state"] = state

        sent_body = False

        async def replay_receive() -> Message:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        response = _Capture(send, self.max_record)
        try:
            await self.app(inner, replay_receive, response.send)
        except BaseException:
            # SPEC §5: the handler failed; the key is given up, the error goes on.
            await attempt.release()
            raise
        if response.start is None:
            await attempt.release()
            return
        status = response.start["status"]
        if status in self.release:
            await attempt.release()
            await response.flush()
            return
        if response.streaming:
            # It went out whole, unrecorded: a marker, so that a retry is refused, never run
            # again (SPEC §13).
            await self._complete(attempt, encode_record(status, [], b"", FLAG_TOO_LARGE))
            return
        record = encode_record(status, response.start.get("headers", []), response.body())
        not_recorded = await self._complete(attempt, record)
        if not_recorded:
            response.add_header(b"idempotency-not-recorded", not_recorded)
        await response.flush()

    async def _complete(self, attempt: Any, record: bytes) -> Optional[bytes]:
        try:
            await attempt.complete(record)
        except LeaseLost:
            return b"lease-lost"
        except PayloadTooLarge:
            return b"too-large"
        except (StoreUnavailable, ShutDown):
            return b"store-unavailable"
        return None


def _status_set(spec: Iterable[Union[int, str]]) -> frozenset:
    out = set()
    for item in spec:
        if isinstance(item, int):
            out.add(item)
        elif re.fullmatch(r"[1-5]xx", item):
            base = int(item[0]) * 100
            out.update(range(base, base + 100))
        elif re.fullmatch(r"\d{3}-\d{3}", item):
            lo, hi = (int(x) for x in item.split("-"))
            out.update(range(lo, hi + 1))
        else:
            out.add(int(item))
    return frozenset(out)


async def _read_body(receive: Receive, limit: int) -> Optional[bytes]:
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _problem(
    send: Send, status: int, code: str, detail: str, extra: Sequence[Tuple[bytes, bytes]] = ()
) -> None:
    body = json.dumps(
        {"code": code, "detail": detail, "status": status, "title": _reason(status), "type": "about:blank"},
        separators=(",", ":"),
        sort_keys=True,
    ).encode("utf-8")
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"cache-control", b"no-store"),
        (b"content-length", str(len(body)).encode("ascii")),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Capture:
    """Holds the handler's answer until it is recorded; one larger than the limit streams
    through instead (marked ``Idempotency-Not-Recorded: too-large``)."""

    def __init__(self, send: Send, limit: int) -> None:
        self._send = send
        self._limit = limit
        self.start: Optional[Message] = None
        self._chunks: List[bytes] = []
        self._size = 0
        self._ended = False
        self.streaming = False

    def body(self) -> bytes:
        return b"".join(self._chunks)

    def add_header(self, name: bytes, value: bytes) -> None:
        assert self.start is not None
        self.start = dict(self.start, headers=list(self.start.get("headers", [])) + [(name, value)])

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        if self.streaming:
            await self._send(message)
            return
        chunk = message.get("body", b"")
        self._chunks.append(chunk)
        self._size += len(chunk)
        self._ended = not message.get("more_body", False)
        if self._size > self._limit:
            self.streaming = True
            self.add_header(b"idempotency-not-recorded", b"too-large")
            await self._send(self.start)  # type: ignore[arg-type]
            await self._send({"type": "http.response.body", "body": self.body(), "more_body": not self._ended})
            self._chunks = []

    async def flush(self) -> None:
        assert self.start is not None
        await self._send(self.start)
        await self._send({"type": "http.response.body", "body": self.body()})
