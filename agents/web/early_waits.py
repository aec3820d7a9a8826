"""What a select of a plan announced invalid before its cause was applied waits for, and how long."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable

from compiler.errors import RequestError

Position = tuple[str, int, int]  # (logical input topic, partition, offset)


@dataclass(frozen=True)
class EarlyWaits:
    """Plans announced stale before the writer applied their events (`agents.stream.fast_path`): a select of one
    waits until that event is applied, so no answer is older than an announcement already sent."""

    waiting: Callable[[str], Position | None] = lambda plan_key: None
    """Plan key -> the (topic, partition, offset) of the event its early announcement named, until applied."""
    wait_applied: Callable[[str, int, int], Awaitable[None]] | None = None
    """Returns once the replica applied the event at this position."""
    announced: Callable[[str], bool] = lambda plan_id: False
    """Plan id -> whether it was announced stale early: a file read begun before that, and ended after its event was
    applied (so nothing is `waiting` any more), may still have found it fresh."""
    seconds: float = 10.0
    """How long a select waits for that before it is refused (503 `plan_being_replaced`)."""

    async def wait(self, position: Position) -> None:
        """Wait until the event at `position` is applied; raise the refusal if it is not within `seconds`."""
        if self.wait_applied is None:
            raise refusal()
        try:
            await asyncio.wait_for(self.wait_applied(*position), self.seconds)
        except asyncio.TimeoutError:
            raise refusal() from None

    async def settled(self, plan_key: str, plan_id: str) -> bool:
        """Whether a plan just compiled stands: not announced stale as it was stored. If it was, wait for the event
        that made it so (the caller then looks again, in state that has it)."""
        position = self.waiting(plan_key)
        if position is None and not self.announced(plan_id):
            return True
        if position is not None:
            await self.wait(position)
        return False


def refusal() -> RequestError:
    """The answer to a select whose plan stays announced invalid while its cause is not applied."""
    return RequestError("plan_being_replaced", "This plan was announced invalid and the change that made it so "
                        "is still being applied; retry shortly.", status=503)
