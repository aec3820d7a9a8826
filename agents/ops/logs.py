"""Logs: JSON lines with ids and reason codes (never content) for machines, short text lines on a terminal."""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone
from typing import TextIO

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


# Libraries whose INFO lines narrate their own services starting and stopping (about fifty
# lines before a worker is ready); their warnings and errors still show.
CHATTY = ("faust", "mode", "aiokafka")

# Our own INFO lines that narrate start-up (broker up, topics created, scenario published,
# objects frozen, partitions read): on a terminal `freshplan run`'s ready block says what they
# would, so a person reads a few lines; JSON logs keep them for machines.
STARTUP_NARRATORS = ("streams.broker", "streams.admin", "agents.cli.loader", "agents.ops.collector",
                     "agents.stream.replica")


def _not_startup_narration(record: logging.LogRecord) -> bool:
    return record.levelno > logging.INFO or record.name not in STARTUP_NARRATORS


def configure(level: str, fmt: str, stream: TextIO | None = None) -> str:
    """Root logging for a process; returns the format chosen.

    `auto` writes short text lines to a terminal and JSON lines anywhere else (files, pipes, log
    collectors). Below DEBUG, the libraries' service chatter is left out in either format, and on
    a terminal our own start-up narration too (the ready block replaces it).
    """
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "text" if stream.isatty() else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    quiet = logging.getLogger().level > logging.DEBUG
    if fmt == "text" and quiet:
        handler.addFilter(_not_startup_narration)
    for name in CHATTY:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level) if quiet else logging.NOTSET)
    return fmt
