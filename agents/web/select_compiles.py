"""Selects that must compile while the writer is busy wait for it together, and are compiled in one job."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Generic, Sequence, TypeVar

GATHERED_AT_MOST = 32
"""Selects compiled by one job (some 5 ms each): a flood of selects that must compile holds an input batch back
for at most `FIRST_IN_A_ROW` such jobs, and those queued after it for `FIRST_AHEAD_AT_MOST` (`agents.stream.writer`)."""

T = TypeVar("T")
R = TypeVar("R")


class _Gathering(Generic[T]):
    """Items waiting for one writer job: the loop adds them until the job takes them on the writer thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[T, asyncio.Future]] = []
        self._taken = False

    def join(self, item: T, done: asyncio.Future) -> bool:
        """Add an item (False: the job has already taken what it runs, or it is full: start another)."""
        with self._lock:
            if self._taken or len(self._items) >= GATHERED_AT_MOST:
                return False
            self._items.append((item, done))
            return True

    def take(self) -> list[T]:
        """What the job runs: everything joined so far, and nothing after (on the writer thread; or on the loop
        when the job never ran, so that nobody joins a gathering that nothing will settle)."""
        with self._lock:
            self._taken = True
            return [item for item, _ in self._items]

    def settle(self, results: Sequence[Any] | BaseException) -> None:
        """Hand each waiter its result, or the exception its result is, or the job's own (on the loop)."""
        for i, (_, done) in enumerate(self._items):
            if done.done():
                continue  # its caller went away
            outcome = results if isinstance(results, BaseException) else results[i]
            if isinstance(outcome, asyncio.CancelledError):
                done.cancel()
            elif isinstance(outcome, BaseException):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)


class SelectCompiles(Generic[T, R]):
    """Runs `compile_many(items)` on the writer for the items that joined before the job started.

    An input batch holds the writer for up to hundreds of ms under a stream; every select that
    must compile meanwhile used to queue a job of its own and store its plan in a transaction of
    its own after that batch. Now they share one job and one transaction. `compile_many` returns
    per item its result or the exception to raise to that item's caller, and what the job counted,
    which `merge` takes on the loop once (whichever callers are still waiting).
    """

    def __init__(self, compile_many: Callable[[list[T]], tuple[Sequence[R | BaseException], Any]],
                 merge: Callable[[Any], None] = lambda counted: None) -> None:
        self.compile_many = compile_many
        self.merge = merge
        self.jobs = 0  # writer jobs run, for /healthz
        self.items = 0  # items they compiled
        self.waiting = 0  # selects waiting for their job now
        self._open: _Gathering[T] | None = None

    async def compile(self, item: T, run: Callable[..., Awaitable[Any]]) -> R:
        """The item's result (or its exception raised), from a writer job `run` runs."""
        done = asyncio.get_running_loop().create_future()
        if self._open is None or not self._open.join(item, done):
            self._open = gathering = _Gathering()
            gathering.join(item, done)
            asyncio.ensure_future(self._run(gathering, run))
        self.waiting += 1
        try:
            return await done
        finally:
            self.waiting -= 1

    async def _run(self, gathering: _Gathering[T], run: Callable[..., Awaitable[Any]]) -> None:
        try:
            results, counted = await run(self._take_and_compile, gathering)
        except BaseException as exc:  # noqa: BLE001 - every waiter gets the job's error (a state error, a cancel)
            # A job refused or cancelled before it ran took nothing: close the gathering, or later selects
            # would join it and wait for ever.
            gathering.take()
            if self._open is gathering:
                self._open = None
            gathering.settle(exc)
            if not isinstance(exc, Exception):
                raise
            return
        self.merge(counted)
        gathering.settle(results)

    def _take_and_compile(self, gathering: _Gathering[T]) -> tuple[Sequence[R | BaseException], Any]:
        items = gathering.take()
        self.jobs += 1
        self.items += len(items)
        return self.compile_many(items)
