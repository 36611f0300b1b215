"""idem.Executor: the C++ executor with Python's conveniences and asyncio forms."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import datetime
import functools
import inspect
import threading
from typing import Any, Awaitable, Callable, Optional, Union

from . import _idem
from ._idem import Attempt, Result, Store

__all__ = ["Executor", "AsyncAttempt", "current_attempt", "open_store"]

Seconds = Union[float, int, datetime.timedelta]
Key = Union[str, bytes]

_current: "contextvars.ContextVar[Any]" = contextvars.ContextVar("idem.current_attempt")

# The per-call options of run, begin, run_async and begin_async.
_CALL_OPTIONS = ("lease", "heartbeat", "ttl", "wait", "fingerprint", "codec")


def current_attempt() -> Optional[Union[Attempt, "AsyncAttempt"]]:
    """The attempt whose action is running in this thread or task (inside ``run``,
    ``run_async`` or a function decorated with ``@idempotent``), else None."""
    return _current.get(None)


def open_store(url: str, *, read_only: bool = False, create_if_missing: bool = True) -> Store:
    """Opens a store from a URL, to share between executors:

    ``memory:``, ``sqlite:///abs/path.db``, ``sqlite:relative.db``,
    ``postgresql://user@host:port/db``, ``redis://[user:password@]host:port/db``.
    ``idem.available_schemes()`` lists what this build has. Raises InvalidArgument for a
    malformed URL or an unknown scheme, StoreUnavailable for a store that cannot be
    reached. The GIL is released while it connects."""
    if not isinstance(url, str):
        raise TypeError(f"url must be str, not {type(url).__name__}")
    return _idem.open_store(url, read_only=read_only, create_if_missing=create_if_missing)


class Executor(_idem.Executor):
    """Runs an action at most once per (scope, key) on a store (SPEC §5).

    ``store`` is a URL (see :func:`open_store`) or a :class:`Store` shared with other
    executors. Options (durations in seconds, or ``datetime.timedelta``):

    - ``lease`` (30): how long a lease lasts without a heartbeat; how soon a crashed
      owner's key can be taken over.
    - ``heartbeat`` (lease / 3): how often the heartbeat thread extends live leases.
    - ``ttl`` (24 h): how long a completed result is replayed.
    - ``wait`` (0): how long a duplicate waits for a busy key before InProgress; 0 fails
      at once. It is woken when the owner finishes (in memory, or by the store's
      notification); ``initial_backoff`` (0.01) and ``max_backoff`` (1) pace its polls of
      the store, the fallback.
    - ``max_payload`` (1 MiB, at most 64 MiB): the largest encoded result.
    - ``shutdown_timeout`` (10): how long ``close()`` waits for open attempts.
    - ``on_event``: called with an :class:`idem.Event` for everything that happens.
    - ``codec``: how results are stored (:mod:`idem.codecs`; the default codec takes
      bytes, str and JSON values).
    - ``async_threads`` (8): threads that make the store calls of the asyncio forms.
    - ``read_only``, ``create_if_missing``: how a URL is opened (see open_store).

    Safe to share between threads and asyncio tasks; share one per store in a process, so
    that duplicates in the process wait on each other in memory.
    """

    def __init__(
        self,
        store: Union[str, Store],
        *,
        lease: Seconds = 30,
        heartbeat: Optional[Seconds] = None,
        ttl: Seconds = 86400,
        wait: Seconds = 0,
        initial_backoff: Seconds = 0.01,
        max_backoff: Seconds = 1,
        max_payload: int = 1 << 20,
        shutdown_timeout: Seconds = 10,
        on_event: Optional[Callable[[_idem.Event], None]] = None,
        codec: Any = None,
        async_threads: int = 8,
        read_only: bool = False,
        create_if_missing: bool = True,
    ) -> None:
        if isinstance(store, str):
            store = open_store(store, read_only=read_only, create_if_missing=create_if_missing)
        elif not isinstance(store, Store):
            raise TypeError(
                f"Executor needs a store URL (str) or an idem.Store, not {type(store).__name__}"
            )
        super().__init__(
            store,
            lease=lease,
            heartbeat=heartbeat,
            ttl=ttl,
            wait=wait,
            initial_backoff=initial_backoff,
            max_backoff=max_backoff,
            max_payload=max_payload,
            shutdown_timeout=shutdown_timeout,
            on_event=on_event,
            codec=codec,
        )
        if async_threads < 1:
            raise ValueError(f"async_threads must be at least 1, got {async_threads}")
        self._async_threads = async_threads
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()

    # --- lifetime ---

    def close(self, timeout: Optional[Seconds] = None) -> None:
        """Shuts the executor down: new calls raise ShutDown, waiting duplicates stop
        waiting; open attempts get ``timeout`` (default shutdown_timeout) to end, then
        their leases are released. Blocks (with the GIL released); idempotent."""
        self.shutdown(timeout)
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- running ---
    #
    # The per-call options are spelled out (not **options) in every entry point, so that a
    # misspelt one is Python's own TypeError ("run() got an unexpected keyword argument
    # 'leas'") rather than pybind11's dump of _begin's signature. _CALL_OPTIONS lists them
    # for the decorator, which checks its own when it decorates.

    def begin(
        self,
        scope: Key,
        key: Key,
        *,
        lease: Optional[Seconds] = None,
        heartbeat: Optional[Seconds] = None,
        ttl: Optional[Seconds] = None,
        wait: Optional[Seconds] = None,
        fingerprint: Optional[Key] = None,
        codec: Any = None,
    ) -> Attempt:
        """The first half of run(), for an action that does not fit in one call: checks the
        inputs, acquires, waits (``wait`` seconds) and replays as run() does, and returns an
        Attempt: a replay (``attempt.replayed``; ``attempt.value`` is the stored result) or
        the lease. Use it as a context manager::

            with executor.begin("payments", key) as attempt:
                if attempt.replayed:
                    return attempt.value
                attempt.complete(charge(card, attempt.token))

        Leaving the block by an exception, or without completing, releases the key. Raises
        InProgress when the key stays busy, and what run() raises. Options as for run().
        The GIL is released while it waits for the store."""
        # Positional: pybind11 matches keywords one by one, a cost on every call.
        answer = self._begin(scope, key, lease, heartbeat, ttl, wait, fingerprint, codec)
        if isinstance(answer, tuple):
            self._in_progress(scope, key, *answer)
        return answer

    def run(
        self,
        scope: Key,
        key: Key,
        fn: Callable[[Attempt], Any],
        *,
        lease: Optional[Seconds] = None,
        heartbeat: Optional[Seconds] = None,
        ttl: Optional[Seconds] = None,
        wait: Optional[Seconds] = None,
        fingerprint: Optional[Key] = None,
        codec: Any = None,
    ) -> Result:
        """Runs ``fn(attempt)`` at most once per (scope, key) and returns the Result: its
        value (``replayed`` False, with the lease's ``token``, ``attempt`` and ``stolen``),
        or the stored value of the run that completed first (``replayed`` True; fn did not
        run). Options for this call: ``lease``, ``heartbeat``, ``ttl``, ``wait`` (seconds to
        wait for a busy key), ``fingerprint`` (str or bytes: the same key with another one
        raises KeyReuse), ``codec``.

        Raises InvalidArgument, InProgress (busy, after ``wait``), KeyReuse, LeaseLost (the
        result was not recorded), StoreUnavailable, DecodeFailed, ShutDown, or fn's own
        exception, unchanged, after releasing the key. The GIL is released while idem waits
        for the store; fn runs in this thread, holding it."""
        # begin(), inline: one Python call less on every run.
        attempt = self._begin(scope, key, lease, heartbeat, ttl, wait, fingerprint, codec)
        if isinstance(attempt, tuple):
            self._in_progress(scope, key, *attempt)
        if attempt.replayed:
            return attempt.result
        token = _current.set(attempt)
        try:
            value = fn(attempt)
        except BaseException:
            attempt.release()  # SPEC §5: release, then the action's own exception
            raise
        finally:
            _current.reset(token)
        try:
            return attempt.complete(value)
        except BaseException:
            attempt.release()  # the codec refused the value: nothing was recorded
            raise

    # --- asyncio ---

    def _executor_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=self._async_threads, thread_name_prefix="idem-async"
                    )
                pool = self._pool
        return pool

    def _submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> "asyncio.Future[Any]":
        # A store call on the pool: the event loop never blocks on it. The call releases
        # the GIL while it waits for the store.
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor_pool(), functools.partial(fn, *args, **kwargs))

    async def _begin_async(self, scope: Key, key: Key, call: dict) -> "AsyncAttempt":
        # The first ask is a store call: on the pool. When the key is busy and the call may
        # wait, the C++ executor waits for it without a thread of ours (SPEC §7): woken in
        # memory when the owner is in this process, by the store's notification when it is
        # in another (polling as the fallback), until the bound. Its callback comes on the
        # executor's waiting thread and only wakes this coroutine through the loop.
        loop = asyncio.get_running_loop()
        woken: "asyncio.Future[None]" = loop.create_future()

        def settle() -> None:
            if not woken.done():
                woken.set_result(None)

        def notify() -> None:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass  # the loop is closed: nobody awaits the answer

        answer = await self._submit(self._begin_or_wait, scope, key, notify, **call)
        if isinstance(answer, _idem._PendingBegin):
            try:
                await woken
            except BaseException:
                # Cancelled: the C++ wait ends at once. A lease it acquired meanwhile is
                # given back, whatever happens to this task from here on.
                leftover = answer.cancel()
                if leftover is not None:
                    await AsyncAttempt(self, leftover)._release_shielded()
                raise
            answer = answer.answer()
        if isinstance(answer, tuple):
            self._in_progress(scope, key, *answer)
        return AsyncAttempt(self, answer)

    def begin_async(
        self,
        scope: Key,
        key: Key,
        *,
        lease: Optional[Seconds] = None,
        heartbeat: Optional[Seconds] = None,
        ttl: Optional[Seconds] = None,
        wait: Optional[Seconds] = None,
        fingerprint: Optional[Key] = None,
        codec: Any = None,
    ) -> "_BeginAsync":
        """begin() for asyncio: ``async with executor.begin_async(scope, key) as attempt``
        (or ``attempt = await executor.begin_async(...)``). The store calls run on the
        executor's threads and waiting on a busy key is asynchronous, so the event loop is
        never blocked; the heartbeat keeps the lease alive while the loop runs your code.
        Inside the block, ``await attempt.complete(value)`` records the result; leaving it
        by an exception (cancellation included), or without completing, releases the key.
        A busy key raises InProgress (after ``wait`` seconds, if given)."""
        options = dict(
            lease=lease, heartbeat=heartbeat, ttl=ttl, wait=wait, fingerprint=fingerprint,
            codec=codec,
        )
        return _BeginAsync(self, scope, key, options)

    async def run_async(
        self,
        scope: Key,
        key: Key,
        fn: Callable[["AsyncAttempt"], Any],
        *,
        lease: Optional[Seconds] = None,
        heartbeat: Optional[Seconds] = None,
        ttl: Optional[Seconds] = None,
        wait: Optional[Seconds] = None,
        fingerprint: Optional[Key] = None,
        codec: Any = None,
    ) -> Result:
        """run() for asyncio: ``fn(attempt)`` may be a coroutine function (or return an
        awaitable). Returns the Result; raises what run() raises, or fn's own exception
        (cancellation included) after releasing the key."""
        options = dict(
            lease=lease, heartbeat=heartbeat, ttl=ttl, wait=wait, fingerprint=fingerprint,
            codec=codec,
        )
        attempt = await self._begin_async(scope, key, options)
        if attempt.replayed:
            return attempt.result
        token = _current.set(attempt)
        try:
            value = fn(attempt)
            if inspect.isawaitable(value):
                value = await value
        except BaseException:
            await attempt._release_shielded()
            raise
        finally:
            _current.reset(token)
        return await attempt._complete_or_release(value)


class _BeginAsync:
    """What begin_async returns: awaitable, and an async context manager."""

    __slots__ = ("_executor", "_scope", "_key", "_options", "_attempt")

    def __init__(self, executor: Executor, scope: Key, key: Key, options: dict) -> None:
        self._executor = executor
        self._scope = scope
        self._key = key
        self._options = options
        self._attempt: Optional[AsyncAttempt] = None

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._executor._begin_async(self._scope, self._key, dict(self._options)).__await__()

    async def __aenter__(self) -> "AsyncAttempt":
        self._attempt = await self._executor._begin_async(self._scope, self._key, dict(self._options))
        return self._attempt

    async def __aexit__(self, *exc: Any) -> bool:
        attempt, self._attempt = self._attempt, None
        if attempt is not None and attempt.active:
            await attempt._release_shielded()
        return False


class AsyncAttempt:
    """An :class:`idem.Attempt` for asyncio: the same properties, with ``complete`` and
    ``release`` as coroutines whose store calls run off the event loop."""

    __slots__ = ("_executor", "_attempt", "__weakref__")

    def __init__(self, executor: Executor, attempt: Attempt) -> None:
        self._executor = executor
        self._attempt = attempt

    # The lease as Attempt shows it.
    replayed = property(lambda self: self._attempt.replayed, doc=Attempt.replayed.__doc__)
    result = property(lambda self: self._attempt.result, doc=Attempt.result.__doc__)
    value = property(lambda self: self._attempt.value, doc=Attempt.value.__doc__)
    scope = property(lambda self: self._attempt.scope)
    key = property(lambda self: self._attempt.key)
    token = property(lambda self: self._attempt.token, doc=Attempt.token.__doc__)
    number = property(lambda self: self._attempt.number, doc=Attempt.number.__doc__)
    stolen = property(lambda self: self._attempt.stolen, doc=Attempt.stolen.__doc__)
    active = property(lambda self: self._attempt.active, doc=Attempt.active.__doc__)
    lease_lost = property(lambda self: self._attempt.lease_lost, doc=Attempt.lease_lost.__doc__)
    stop_requested = property(
        lambda self: self._attempt.stop_requested, doc=Attempt.stop_requested.__doc__
    )

    @property
    def attempt(self) -> Attempt:
        """The underlying synchronous Attempt."""
        return self._attempt

    def raise_if_lost(self) -> None:
        """Raises idem.LeaseLost when lease_lost."""
        self._attempt.raise_if_lost()

    async def complete(self, value: Any) -> Result:
        """Records value as the key's result (off the event loop) and ends the lease."""
        return await self._executor._submit(self._attempt.complete, value)

    async def release(self) -> None:
        """Gives the key up (off the event loop); the next caller runs as attempt 1."""
        await self._release_shielded()

    def add_stop_callback(self, fn: Callable[[], Any]) -> None:
        """As Attempt.add_stop_callback: fn() runs on the thread that noticed the loss."""
        self._attempt.add_stop_callback(fn)

    def stopped(self) -> "asyncio.Future[None]":
        """A future of the running loop that completes when stop_requested becomes true
        (the lease was lost, or the executor released it): ``await`` it beside your work,
        or ``add_done_callback`` to cancel a task."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not fut.done():
                fut.set_result(None)

        def on_stop() -> None:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass  # the loop is closed

        self._attempt.add_stop_callback(on_stop)
        return fut

    async def _release_shielded(self) -> None:
        # Release even when the task is being cancelled: the store call goes on to the end
        # on the pool, whatever happens to this await.
        if not self._attempt.active:
            return
        fut = self._executor._submit(self._attempt.release)
        await asyncio.shield(fut)

    async def _complete_or_release(self, value: Any) -> Result:
        try:
            return await self._executor._submit(self._attempt.complete, value)
        except BaseException:
            # The codec refused the value, or this task was cancelled while completing: the
            # key is given up unless complete() got through.
            await self._release_shielded()
            raise

    def __repr__(self) -> str:
        return "idem.AsyncAttempt" + repr(self._attempt)[len("idem.Attempt") :]

    async def __aenter__(self) -> "AsyncAttempt":
        return self

    async def __aexit__(self, *exc: Any) -> bool:
        if self._attempt.active:
            await self._release_shielded()
        return False
