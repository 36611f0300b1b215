"""Codecs: the default one round-trips bytes, str and JSON values; others plug in; a codec
that cannot read a record gives DecodeFailed; one that cannot write releases the key."""

from __future__ import annotations

import json

import pytest

import idem


@pytest.mark.parametrize(
    "value",
    [b"", b"\x00\xff raw", "text ünïcode", "", 42, -1.5, True, None, [1, "a", None], {"a": {"b": [1, 2]}}],
)
def test_the_default_codec_round_trips_through_a_replay(executor, scope, value):
    first = executor.run(scope, "k", lambda a: value)
    assert first.value is value  # a fresh run returns the action's own object
    again = executor.run(scope, "k", lambda a: pytest.fail("ran twice"))
    assert again.replayed
    assert again.value == value and type(again.value) is type(value)


def test_the_default_codec_format():
    c = idem.DefaultCodec()
    assert c.encode(b"ab") == b"\x00ab"
    assert c.encode(bytearray(b"ab")) == b"\x00ab"
    assert c.encode("é") == '"é"'.encode()
    assert c.encode({"a": [1, 2]}) == b'{"a":[1,2]}'
    assert c.decode(b"") is None  # an empty record: a C++ action that returned nothing
    assert c.decode(b'{"a":1}') == {"a": 1}
    with pytest.raises(ValueError):
        c.encode(float("nan"))  # not JSON
    with pytest.raises(TypeError):
        c.encode(object())


def test_tuples_come_back_as_lists_only_on_replay(executor, scope):
    assert executor.run(scope, "k", lambda a: (1, 2)).value == (1, 2)
    assert executor.run(scope, "k", lambda a: None).value == [1, 2]


def test_the_bytes_codec_stores_bytes_as_they_are(executor, store, scope):
    executor.run(scope, "k", lambda a: b"plain", codec=idem.BytesCodec())
    assert store.get(scope, "k")["payload"] == b"plain"
    with pytest.raises(TypeError):
        executor.run(scope, "k2", lambda a: "not bytes", codec=idem.BytesCodec())
    assert store.get(scope, "k2") is None  # the key was released


def test_str_and_json_codecs(executor, store, scope):
    executor.run(scope, "s", lambda a: "ça", codec=idem.StrCodec())
    assert store.get(scope, "s")["payload"] == "ça".encode()
    executor.run(scope, "j", lambda a: {"x": 1}, codec=idem.JsonCodec())
    assert json.loads(store.get(scope, "j")["payload"]) == {"x": 1}
    assert executor.run(scope, "j", lambda a: 0, codec=idem.JsonCodec()).value == {"x": 1}


class Upper:
    """A custom codec: any object with encode and decode."""

    def encode(self, value):
        return value.upper().encode()

    def decode(self, data):
        return "decoded:" + data.decode()


def test_a_custom_codec_per_executor_and_per_call(store, scope):
    ex = idem.Executor(store, codec=Upper())
    try:
        assert isinstance(ex.codec, Upper)
        assert isinstance(Upper(), idem.Codec)
        assert ex.run(scope, "k", lambda a: "abc").value == "abc"
        assert ex.run(scope, "k", lambda a: "x").value == "decoded:ABC"
        # A per-call codec wins over the executor's.
        assert ex.run(scope, "k", lambda a: "x", codec=idem.BytesCodec()).value == b"ABC"
    finally:
        ex.close(timeout=0)


class Broken:
    def encode(self, value):
        return b"stored"

    def decode(self, data):
        raise ValueError("cannot read this")


def test_a_codec_that_cannot_decode_gives_decode_failed(executor, store, scope):
    executor.run(scope, "k", lambda a: "v", codec=Broken())
    with pytest.raises(idem.DecodeFailed) as e:
        executor.run(scope, "k", lambda a: "v", codec=Broken())
    assert e.value.data == b"stored"
    assert "cannot read this" in e.value.reason
    assert isinstance(e.value.__cause__, ValueError)
    assert not e.value.retryable
    assert store.get(scope, "k")["state"] == "complete"  # the record is intact


def test_encode_must_return_bytes(executor, store, scope):
    class Wrong:
        def encode(self, value):
            return "a str"

        def decode(self, data):
            return data

    with pytest.raises(TypeError, match="must return bytes"):
        executor.run(scope, "k", lambda a: "v", codec=Wrong())
    assert store.get(scope, "k") is None
