"""What every public entry point says of an argument it cannot take (issue 36): a TypeError
or an idem.InvalidArgument that names the argument as Python spells it ("wait", not the
library's "max_wait"), and the value as it was given ("not a number", never a clamped count
of milliseconds). Never pybind11's "Unable to cast Python instance to C++ type" or its dump
of an internal signature."""

from __future__ import annotations

import asyncio
import math
import re

import pytest

import idem
from idem import transaction
from idem.asgi import IdempotencyMiddleware

PYBIND11_INTERNALS = ("Unable to cast", "incompatible function arguments", "_idem.", "Invoked with")


def assert_plain(error: BaseException) -> None:
    text = str(error)
    for internal in PYBIND11_INTERNALS:
        assert internal not in text, text


@pytest.fixture
def ex():
    executor = idem.Executor("memory:")
    yield executor
    executor.close(timeout=0)


async def _begin_async_awaited(ex, scope, key, **options):
    attempt = await ex.begin_async(scope, key, **options)
    await attempt.release()


async def _begin_async_with(ex, scope, key, **options):
    async with ex.begin_async(scope, key, **options):
        pass


async def _decorated_async(ex, scope, key, **options):
    @idem.idempotent(ex, scope=scope, key=lambda: key, **options)
    async def fn():
        return 1

    return await fn()


def _decorated(ex, scope, key, **options):
    @idem.idempotent(ex, scope=scope, key=lambda: key, **options)
    def fn():
        return 1

    return fn()


# Every public way in that takes a scope and a key, as fn(executor, scope, key, **options).
FORMS = {
    "run": lambda ex, s, k, **o: ex.run(s, k, lambda a: 1, **o),
    "begin": lambda ex, s, k, **o: ex.begin(s, k, **o).release(),
    "run_async": lambda ex, s, k, **o: asyncio.run(ex.run_async(s, k, lambda a: 1, **o)),
    "begin_async (await)": lambda ex, s, k, **o: asyncio.run(_begin_async_awaited(ex, s, k, **o)),
    "begin_async (async with)": lambda ex, s, k, **o: asyncio.run(_begin_async_with(ex, s, k, **o)),
    "idempotent": _decorated,
    "idempotent (async def)": lambda ex, s, k, **o: asyncio.run(_decorated_async(ex, s, k, **o)),
    # The caller's connection is not touched before the key is taken: any object does.
    "run_in_transaction": lambda ex, s, k, **o: transaction.run_in_transaction(
        ex, object(), s, k, lambda a: 1
    ),
}
STORE_FORMS = {
    "store.get": lambda ex, s, k: ex.store.get(s, k),
    "store.forget": lambda ex, s, k: ex.store.forget(s, k),
}
ALL_FORMS = {**FORMS, **STORE_FORMS}
# Forms that take per-call options.
OPTION_FORMS = {name: FORMS[name] for name in FORMS if name != "run_in_transaction"}


@pytest.mark.parametrize("bad", [None, 42, 1.5, ["k"], object()], ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("which", ["scope", "key"])
@pytest.mark.parametrize("form", list(ALL_FORMS))
def test_a_scope_or_key_of_the_wrong_type_is_a_type_error_naming_it(ex, form, which, bad):
    if form.startswith("idempotent") and which == "scope" and bad is None:
        pytest.skip("the decorator's scope=None is the function's own name")
    scope, key = ("s", bad) if which == "key" else (bad, "k")
    with pytest.raises(TypeError) as e:
        ALL_FORMS[form](ex, scope, key)
    assert str(e.value) == f"{which} must be str or bytes, not {type(bad).__name__}"
    assert ex.active_leases == 0
    # The executor goes on as before.
    assert ex.run("s", "after", lambda a: 7).value == 7


@pytest.mark.parametrize("which", ["scope", "key"])
@pytest.mark.parametrize("form", list(ALL_FORMS))
def test_a_str_with_a_lone_surrogate_is_invalid_argument_naming_it(ex, form, which):
    # The type is right, the value has no UTF-8 form: a ValueError by Python's convention
    # (str.encode raises UnicodeEncodeError), and idem's InvalidArgument like any other
    # scope or key that cannot be one, with the UnicodeEncodeError as its cause.
    scope, key = ("s", "a\ud800b") if which == "key" else ("a\ud800b", "k")
    with pytest.raises(idem.InvalidArgument) as e:
        ALL_FORMS[form](ex, scope, key)
    err = e.value
    assert isinstance(err, ValueError) and err.argument == which
    assert str(err).startswith(f"invalid {which}: ") and "U+D800 at index 1" in str(err)
    assert isinstance(err.__cause__, UnicodeEncodeError)
    assert_plain(err)
    assert ex.active_leases == 0


def test_bytes_and_bytearray_still_work(ex):
    assert ex.run(b"s", bytearray(b"\xffk"), lambda a: 3).value == 3
    assert ex.run("s", b"\xffk", lambda a: 4).replayed
    assert ex.store.get(bytearray(b"s"), b"\xffk")["state"] == "complete"


def test_a_surrogate_escaped_file_name_is_refused_not_mangled(ex):
    # os.fsdecode(b"\xff") is "\udcff": the bytes it stands for are a valid key, the str is not.
    with pytest.raises(idem.InvalidArgument, match="U\\+DCFF"):
        ex.run("s", "\udcff", lambda a: 1)


@pytest.mark.parametrize("form", list(OPTION_FORMS))
def test_an_unknown_keyword_names_itself(ex, form):
    with pytest.raises(TypeError) as e:
        OPTION_FORMS[form](ex, "s", "k", leases=5)
    assert_plain(e.value)
    assert re.search(r"\(\) got an unexpected keyword argument 'leases'", str(e.value)), str(e.value)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda ex: ex.run("s", "k", lambda a: 1, foo=1), "run"),
        (lambda ex: ex.begin("s", "k", foo=1), "begin"),
        (lambda ex: ex.run_async("s", "k", lambda a: 1, foo=1), "run_async"),
        (lambda ex: ex.begin_async("s", "k", foo=1), "begin_async"),
        (lambda ex: idem.idempotent(ex, key=lambda: "k", foo=1), "idempotent"),
    ],
    ids=["run", "begin", "run_async", "begin_async", "idempotent"],
)
def test_the_unknown_keyword_error_names_the_function(ex, call, name):
    with pytest.raises(TypeError, match=rf"\b{name}\(\) got an unexpected keyword argument 'foo'$"):
        call(ex)


@pytest.mark.parametrize("form", list(OPTION_FORMS))
def test_a_fingerprint_of_the_wrong_type_is_a_type_error_naming_it(ex, form):
    if form == "idempotent":
        # The decorator takes a function that computes the fingerprint: its result is checked.
        call = idem.idempotent(ex, scope="s", key=lambda: "k", fingerprint=lambda: 5)(lambda: 1)
    elif form == "idempotent (async def)":

        async def afn():
            return 1

        decorated = idem.idempotent(ex, scope="s", key=lambda: "k", fingerprint=lambda: 5)(afn)
        call = lambda: asyncio.run(decorated())  # noqa: E731
    else:
        call = lambda: OPTION_FORMS[form](ex, "s", "k", fingerprint=5)  # noqa: E731
    with pytest.raises(TypeError) as e:
        call()
    assert str(e.value) == "fingerprint must be str or bytes (or None), not int"
    assert ex.active_leases == 0


def test_a_fingerprint_with_a_lone_surrogate_is_invalid_argument(ex):
    with pytest.raises(idem.InvalidArgument) as e:
        ex.run("s", "k", lambda a: 1, fingerprint="\ud800")
    assert e.value.argument == "fingerprint" and isinstance(e.value.__cause__, UnicodeEncodeError)


def test_the_decorator_checks_what_it_can_when_it_decorates(ex):
    with pytest.raises(TypeError, match=r"^scope must be str or bytes, not int$"):
        idem.idempotent(ex, scope=42, key=lambda: "k")
    with pytest.raises(idem.InvalidArgument) as e:
        idem.idempotent(ex, scope="", key=lambda: "k")
    assert e.value.argument == "scope"
    with pytest.raises(TypeError, match="key must be a function"):
        idem.idempotent(ex, scope="s", key="k")
    with pytest.raises(TypeError, match="fingerprint must be a function"):
        idem.idempotent(ex, scope="s", key=lambda: "k", fingerprint="digest")
    with pytest.raises(idem.InvalidArgument, match="not a number") as e:
        idem.idempotent(ex, scope="s", key=lambda: "k", ttl=math.nan)
    assert e.value.argument == "ttl"


def test_other_arguments_name_themselves(ex):
    with pytest.raises(TypeError, match=r"^url must be str, not int$"):
        idem.open_store(42)
    with pytest.raises(TypeError, match=r"^limit must be an int, not str$"):
        ex.store.purge("10")
    with pytest.raises(idem.InvalidArgument) as e:
        ex.store.purge(-1)
    assert e.value.argument == "limit"
    with pytest.raises(TypeError, match=r"^max_payload must be an int, not float$"):
        idem.Executor("memory:", max_payload=1.5)
    with pytest.raises(idem.InvalidArgument) as e:
        idem.Executor("memory:", max_payload=-1)
    assert e.value.argument == "max_payload"
    with pytest.raises(TypeError, match=r"^scope must be str, not bytes$"):
        IdempotencyMiddleware(None, ex, scope=b"fixed")
    with pytest.raises(idem.InvalidArgument) as e:
        IdempotencyMiddleware(None, ex, scope="fixed\ud800")
    assert e.value.argument == "scope"


# --- durations ---

# (value, what the message must say). The library counts whole milliseconds up to 365 days.
REFUSED_EVERYWHERE = [
    (math.nan, "not a number (nan)"),
    (math.inf, "got inf"),
    (-math.inf, "got -inf"),
    (-1, "got -1 s"),
    (-0.5, "got -0.5 s"),
    (366 * 86400, "365 days (31536000 s), got 31622400 s"),
    (1e300, "got 1e+300 s"),
    (10**400, "365 days (31536000 s), got an int of 401 digits"),
]
REFUSED_WHEN_POSITIVE = [(0, "got 0 s"), (0.0, "got 0.0 s"), (0.0001, "at least 0.001 s")]
PER_CALL = {"lease": True, "heartbeat": True, "ttl": True, "wait": False}  # name: must be > 0
EXECUTOR = {
    "lease": True,
    "heartbeat": True,
    "ttl": True,
    "wait": False,
    "initial_backoff": True,
    "max_backoff": True,
    "shutdown_timeout": False,
}


def cases(options):
    for name, positive in options.items():
        for value, says in REFUSED_EVERYWHERE + (REFUSED_WHEN_POSITIVE if positive else []):
            yield pytest.param(name, value, says, id=f"{name}={value!r}"[:40])


def assert_names_the_option(err, name, says):
    text = str(err)
    assert isinstance(err, idem.InvalidArgument) and err.argument == name, text
    assert text.startswith(f"invalid {name}: ") and says in text, text
    assert "max_wait" not in text and "1000000000000000" not in text, text


@pytest.mark.parametrize("name, value, says", list(cases(PER_CALL)))
@pytest.mark.parametrize("form", list(OPTION_FORMS))
def test_a_per_call_duration_that_cannot_be_one_names_the_option(ex, form, name, value, says):
    with pytest.raises(idem.InvalidArgument) as e:
        OPTION_FORMS[form](ex, "s", "k", **{name: value})
    assert_names_the_option(e.value, name, says)
    assert ex.active_leases == 0


@pytest.mark.parametrize("name, value, says", list(cases(PER_CALL)))
def test_the_decorator_and_the_middleware_check_durations(ex, name, value, says):
    with pytest.raises(idem.InvalidArgument) as e:
        idem.idempotent(ex, scope="s", key=lambda: "k", **{name: value})
    assert_names_the_option(e.value, name, says)
    if name != "heartbeat":  # the middleware has no heartbeat option
        with pytest.raises(idem.InvalidArgument) as e:
            IdempotencyMiddleware(None, ex, **{name: value})
        assert_names_the_option(e.value, name, says)


@pytest.mark.parametrize("name, value, says", list(cases(EXECUTOR)))
def test_an_executor_duration_that_cannot_be_one_names_the_option(name, value, says):
    with pytest.raises(idem.InvalidArgument) as e:
        idem.Executor("memory:", **{name: value})
    assert_names_the_option(e.value, name, says)


@pytest.mark.parametrize("value, says", REFUSED_EVERYWHERE)
def test_close_timeout(value, says):
    ex = idem.Executor("memory:")
    with pytest.raises(idem.InvalidArgument) as e:
        ex.close(timeout=value)
    assert_names_the_option(e.value, "timeout", says)
    assert not ex.is_shut_down
    ex.close(timeout=0)


def test_zero_is_fine_where_it_means_not_at_all(ex):
    assert ex.run("s", "k", lambda a: 1, wait=0).value == 1
    idem.Executor("memory:", wait=0, shutdown_timeout=0).close(timeout=0)


def test_heartbeat_zero_says_how_to_get_the_default(ex):
    with pytest.raises(idem.InvalidArgument, match=r"leave it unset \(None\) for lease / 3"):
        ex.run("s", "k", lambda a: 1, heartbeat=0)


def test_the_limits_between_options_are_in_seconds(ex):
    with pytest.raises(idem.InvalidArgument) as e:
        idem.Executor("memory:", lease=30, heartbeat=60)
    assert e.value.argument == "heartbeat"
    assert str(e.value) == "invalid heartbeat: must be shorter than the lease (30 s), got 60 s"
    with pytest.raises(idem.InvalidArgument) as e:
        ex.run("s", "k", lambda a: 1, lease=1.5, heartbeat=2)
    assert str(e.value) == "invalid heartbeat: must be shorter than this call's lease (1.5 s), got 2 s"
    with pytest.raises(idem.InvalidArgument) as e:
        ex.run("s", "k", lambda a: 1, heartbeat=45)
    assert str(e.value) == "invalid heartbeat: must be shorter than the executor's lease (30 s), got 45 s"
    with pytest.raises(idem.InvalidArgument) as e:
        idem.Executor("memory:", initial_backoff=0.5, max_backoff=0.25)
    assert e.value.argument == "max_backoff"
    assert str(e.value) == "invalid max_backoff: must be at least initial_backoff (0.5 s), got 0.25 s"
    assert ex.active_leases == 0
