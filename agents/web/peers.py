"""Where a worker stands among its group's workers, as the read path needs it: who owns an entity's plans."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class NotOwner(Exception):
    """The entity's plans belong to a partition another worker owns: its owner answers the select."""

    def __init__(self, entity_id: str, partition: int) -> None:
        super().__init__(f"entity partition {partition} is owned elsewhere")
        self.entity_id = entity_id
        self.partition = partition


@dataclass(frozen=True)
class Peers:
    """Where this worker stands among its group's workers, as the read path needs it (defaults: a lone worker)."""

    served_by: str | None = None
    """This worker's URL, named in every answer it serves."""
    foreign_partition: Callable[[str], int | None] = lambda entity_id: None
    """Entity id -> its partition when another worker owns it, else None (then its owner answers)."""
    foreign_partitions: Callable[[], list[int]] = lambda: []
    """Plan partitions other workers own (all of them while the group has assigned none)."""
