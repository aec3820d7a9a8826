"""Structured logs: one JSON object per line with ids and reason codes, never content."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import orjson

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonLines(logging.Formatter):
    """Formats a record as JSON: time, level, logger, message and every `extra=` field."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat().replace("+00:00", "Z"),
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        doc.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def configure(level: str, fmt: str) -> None:
    """Root logging for a worker process: JSON lines (default) or plain text."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
