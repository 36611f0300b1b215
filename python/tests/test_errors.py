"""The exception hierarchy mirrors idem::Error."""

from __future__ import annotations

import pytest

import idem


def test_every_error_is_an_idem_error_with_a_code():
    expected = {
        idem.InvalidArgument: ("invalid_argument", False),
        idem.PayloadTooLarge: ("payload_too_large", False),
        idem.InProgress: ("in_progress", True),
        idem.KeyReuse: ("key_reuse", False),
        idem.LeaseLost: ("lease_lost", True),
        idem.StoreUnavailable: ("store_unavailable", True),
        idem.DecodeFailed: ("decode_failed", False),
        idem.ShutDown: ("shut_down", True),
    }
    for cls, (code, retryable) in expected.items():
        assert issubclass(cls, idem.Error)
        assert cls.code == code and cls.retryable is retryable
    assert issubclass(idem.PayloadTooLarge, idem.InvalidArgument)
    assert issubclass(idem.InvalidArgument, ValueError)
    assert issubclass(idem.StoreUnavailable, ConnectionError)


def test_raised_errors_carry_their_facts(executor, scope):
    with pytest.raises(idem.Error) as e:
        executor.run(scope, "", lambda a: 1)
    err = e.value
    assert type(err) is idem.InvalidArgument
    assert err.code == "invalid_argument" and err.retryable is False
    assert err.argument == "key" and "key" in str(err)
    with executor.begin(scope, "k"):
        with pytest.raises(idem.InProgress) as e:
            executor.run(scope, "k", lambda a: 1)
    assert e.value.scope == scope and e.value.key == "k"


def test_binary_keys_show_as_bytes(executor, scope):
    with executor.begin(scope, b"\xff\x00"):
        with pytest.raises(idem.InProgress) as e:
            executor.run(scope, b"\xff\x00", lambda a: 1)
    assert e.value.key == b"\xff\x00"
