"""@idempotent: a function that runs at most once per key."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, TypeVar, Union

from ._executor import Executor
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
    """

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
