"""@idempotent."""

from __future__ import annotations

import asyncio

import pytest

import idem


def test_a_decorated_function_runs_once_per_key(executor, scope):
    calls = []

    @idem.idempotent(executor, scope=scope, key=lambda order, amount: order)
    def charge(order, amount):
        attempt = idem.current_attempt()
        calls.append((order, amount, attempt.token))
        return {"charged": amount, "token": attempt.token}

    first = charge("o-1", 100)
    assert charge("o-1", 100) == first
    assert charge(amount=100, order="o-1") == first
    assert charge("o-2", 5)["charged"] == 5
    assert [c[0] for c in calls] == ["o-1", "o-2"]
    r = charge.result("o-1", 100)
    assert r.replayed and r.value == first
    assert charge.__name__ == "charge" and charge.scope == scope


def test_the_default_scope_is_the_functions_name(executor):
    @idem.idempotent(executor, key=lambda x: str(x))
    def square(x):
        return x * x

    assert square.scope.endswith("test_the_default_scope_is_the_functions_name.<locals>.square")
    assert square(3) == 9


def test_a_fingerprint_refuses_reuse(executor, scope):
    @idem.idempotent(executor, scope=scope, key=lambda k, body: k, fingerprint=lambda k, body: body)
    def handle(k, body):
        return body

    assert handle("k", "a") == "a"
    assert handle("k", "a") == "a"
    with pytest.raises(idem.KeyReuse):
        handle("k", "b")


def test_an_exception_releases_and_the_next_call_runs(executor, store, scope):
    n = {"calls": 0}

    @idem.idempotent(executor, scope=scope, key=lambda: "k")
    def flaky():
        n["calls"] += 1
        if n["calls"] == 1:
            raise ConnectionError("upstream down")
        return "ok"

    with pytest.raises(ConnectionError):
        flaky()
    assert flaky() == "ok"
    assert flaky() == "ok"
    assert n["calls"] == 2


def test_an_async_function_is_decorated_too(executor, scope):
    calls = []

    @idem.idempotent(executor, scope=scope, key=lambda k: k, ttl=60)
    async def work(k):
        await asyncio.sleep(0)
        calls.append(idem.current_attempt().token)
        return k.upper()

    async def main():
        assert await work("a") == "A"
        assert await work("a") == "A"
        r = await work.result("a")
        assert r.replayed

    asyncio.run(main())
    assert len(calls) == 1
