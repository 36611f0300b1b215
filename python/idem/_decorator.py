"""@idempotent: a function that runs at most once per key."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, TypeVar, Union

from . import _idem
from ._executor import _CALL_OPTIONS, Executor
from ._idem import Result

__all__ = ["idempotent"]

F = TypeVar("F", bound=Callable[..., Any])
Key = Union[str, bytes]


def idempotent(
    executor: Executor,
    *,
    key: Callable[..., Key],
    scope: Optional[Key] = None,
    fingerprint: Optional[Callable[..., Union[str, bytes]]] = None,
    **options: Any,
) -> Callable[[F], F]:
    """Makes a function run at most once per key::

        @idempotent(executor, scope="charges", key=lambda order_id, amount: order_id)
        def charge(order_id: str, amount: int) -> dict:
            token = idem.current_attempt().token   # the fencing token
            ...

    ``key(*args, **kwargs)`` (called with the function's own arguments) names the key;
    ``scope`` defaults to the function's module and qualified name. ``fingerprint(*args,
    **kwargs)``, when given, digests the request: the same key with another fingerprint
    raises KeyReuse. Other keyword arguments are per-call options of ``run`` (``ttl``,
    ``lease``, ``wait``, ``codec``...).

    Calling the function returns its value: its own on a fresh run, the stored one on a
    replay. ``fn.result(*args, **kwargs)`` returns the whole :class:`idem.Result`
    (``replayed``, ``token``...). An ``async def`` function is decorated the same way and
    runs through ``run_async``. Inside, ``idem.current_attempt()`` is the attempt.

    What can be checked when it decorates is: an unknown option, or a ``key`` or
    ``fingerprint`` that is not callable, raises TypeError; a ``scope`` or a duration that
    cannot be one raises what ``run`` would raise (TypeError, InvalidArgument).
    """
    for name in options:
        if name not in _CALL_OPTIONS:
            raise TypeError(f"idempotent() got an unexpected keyword argument {name!r}")
    if not callable(key):
        raise TypeError(
            "idempotent()'s key must be a function of the decorated function's arguments "
            f"that returns the key (str or bytes), not {type(key).__name__}"
        )
    if fingerprint is not None and not callable(fingerprint):
        raise TypeError(
            "idempotent()'s fingerprint must be a function of the decorated function's "
            f"arguments that returns a digest (str or bytes), not {type(fingerprint).__name__}"
        )
    if scope is not None:
        _idem._check_scope(scope)
    executor._check_call_options(**{n: v for n, v in options.items() if n != "codec"})

    def decorate(fn: F) -> F:
        the_scope = scope if scope is not None else f"{fn.__module__}.{fn.__qualname__}"

        def call_options(args: tuple, kwargs: dict) -> dict:
            if fingerprint is None:
                return options
            return {**options, "fingerprint": fingerprint(*args, **kwargs)}

        if inspect.iscoroutinefunction(fn):

            async def result_async(*args: Any, **kwargs: Any) -> Result:
                return await executor.run_async(
                    the_scope,
                    key(*args, **kwargs),
                    lambda attempt: fn(*args, **kwargs),
                    **call_options(args, kwargs),
                )

            @functools.wraps(fn)
            async def wrapper_async(*args: Any, **kwargs: Any) -> Any:
                return (await result_async(*args, **kwargs)).value

            wrapper_async.result = result_async  # type: ignore[attr-defined]
            wrapper_async.scope = the_scope  # type: ignore[attr-defined]
            return wrapper_async  # type: ignore[return-value]

        def result(*args: Any, **kwargs: Any) -> Result:
            return executor.run(
                the_scope,
                key(*args, **kwargs),
                lambda attempt: fn(*args, **kwargs),
                **call_options(args, kwargs),
            )

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return result(*args, **kwargs).value

        wrapper.result = result  # type: ignore[attr-defined]
        wrapper.scope = the_scope  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
