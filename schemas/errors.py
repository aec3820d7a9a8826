"""The one domain error every decode and validation failure becomes."""

from __future__ import annotations


class InvalidEvent(ValueError):
    """An input event that cannot be applied; it goes to `dead-letters` with this reason.

    `error_class` is machine-readable (malformed_json, schema_violation,
    unknown_schema_version, oversized, invalid_value, invalid_policy, clock_regression,
    clock_jump, event_id_conflict, ...); the message says
    what to fix in the producer.
    """

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message

    def __str__(self) -> str:
        return f"{self.error_class}: {self.message}"


class SkippedEvent(Exception):
    """A message that carries no change (a Debezium heartbeat or transaction boundary): counted, not applied."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind
