"""Topic declarations: the design's topics with the settings' prefix and partition count."""

from __future__ import annotations

from dataclasses import dataclass

import faust

from streams.settings import COMPACTED_TOPICS, INPUT_TOPICS, INTERNAL_TOPICS, OUTPUT_TOPICS, Settings


@dataclass(frozen=True)
class Topics:
    """The Faust topics of one app, by the design's names."""

    by_name: dict[str, faust.TopicT]
    """Logical topic name -> declared topic."""
    logical: dict[str, str]
    """Broker-side topic name -> logical name."""

    def __getitem__(self, name: str) -> faust.TopicT:
        return self.by_name[name]


def declare_topics(app: faust.App, settings: Settings) -> Topics:
    """Declare every topic as raw bytes; the schemas package decodes values."""
    by_name = {}
    for name in INPUT_TOPICS + OUTPUT_TOPICS + INTERNAL_TOPICS:
        by_name[name] = app.topic(settings.topic(name), key_type=bytes, value_type=bytes,
                                  key_serializer="raw", value_serializer="raw",
                                  partitions=settings.partitions, compacting=(name in COMPACTED_TOPICS))
    return Topics(by_name, {settings.topic(n): n for n in by_name})
