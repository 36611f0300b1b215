"""Codecs: how results become the bytes a store keeps, and back (SPEC §5).

A codec is any object with two methods::

    class Codec(Protocol):
        def encode(self, value: Any) -> bytes: ...
        def decode(self, data: bytes) -> Any: ...

Give one to an executor (``Executor(url, codec=...)``) or to one call (``run(...,
codec=...)``). ``decode`` must accept whatever ``encode`` ever produced, including records
written by an earlier version of your program. If it raises, the caller gets
:class:`idem.DecodeFailed` (the record is left as it is). A fresh run returns the action's
own value; only replays go through ``decode``.

- :class:`DefaultCodec` (the default): JSON for what ``json.dumps`` takes, bytes as one
  0x00 byte followed by the bytes; replays come back with the same kind (bytes stay bytes,
  str stays str).
- :class:`BytesCodec`: the bytes as they are, for records shared with the C++ library, the
  ``idem`` tool or the proxy.
- :class:`StrCodec`: text in an encoding (UTF-8).
- :class:`JsonCodec`: plain JSON, with your own ``dumps``/``loads`` (an ``orjson`` or a
  ``default=`` for dataclasses, say); readable by the C++ library's JSON codec.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Protocol, runtime_checkable

from ._idem import DefaultCodec

__all__ = ["Codec", "DefaultCodec", "BytesCodec", "StrCodec", "JsonCodec"]


@runtime_checkable
class Codec(Protocol):
    """What an executor needs of a codec."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class BytesCodec:
    """Values are bytes (or bytearray, memoryview) and are stored as they are."""

    def encode(self, value: Any) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"BytesCodec stores bytes, not {type(value).__name__}")

    def decode(self, data: bytes) -> bytes:
        return data

    def __repr__(self) -> str:
        return "idem.BytesCodec()"


class StrCodec:
    """Values are str, stored in ``encoding``."""

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = encoding

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"StrCodec stores str, not {type(value).__name__}")
        return value.encode(self.encoding)

    def decode(self, data: bytes) -> str:
        return data.decode(self.encoding)

    def __repr__(self) -> str:
        return f"idem.StrCodec({self.encoding!r})"


class JsonCodec:
    """Plain JSON (UTF-8). ``dumps`` and ``loads`` replace json.dumps and json.loads: pass
    ``functools.partial(json.dumps, default=...)`` for types json does not know."""

    def __init__(
        self,
        dumps: Callable[[Any], Any] | None = None,
        loads: Callable[[bytes], Any] | None = None,
    ) -> None:
        self._dumps = dumps or (lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")))
        self._loads = loads or json.loads

    def encode(self, value: Any) -> bytes:
        out = self._dumps(value)
        return out.encode("utf-8") if isinstance(out, str) else bytes(out)

    def decode(self, data: bytes) -> Any:
        return self._loads(data)

    def __repr__(self) -> str:
        return "idem.JsonCodec()"
