"""Publish scenario files (JSON lines of {topic, event}) to the input topics."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson

from agents.web.token_keys import TokenKeyError, TokenKeys
from schemas.codec import event_key
from schemas.freshness import encode_token
from streams.admin import ensure_topics, producer
from streams.incarnation import read_cluster_id
from streams.settings import INPUT_TOPICS, Settings

log = logging.getLogger(__name__)


class ScenarioError(ValueError):
    """A scenario line that is not `{"topic": <input topic>, "event": {...}}`; fix the file."""


def read_scenario(path: Path) -> list[tuple[str, bytes | None, bytes]]:
    """(topic, key, value) for every line, keys derived as the design's topic table says."""
    records = []
    for number, line in enumerate(Path(path).read_text("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ScenarioError(f"{path}:{number}: not JSON ({exc})") from None
        topic = item.get("topic") if isinstance(item, dict) else None
        if topic not in INPUT_TOPICS or "event" not in item:
            raise ScenarioError(f"{path}:{number}: expected {{\"topic\": one of {', '.join(INPUT_TOPICS)}, "
                                "\"event\": {...}}")
        event = item["event"]
        try:
            key = event_key(topic, event)
        except (KeyError, TypeError, AttributeError):
            key = None  # an invalid event still travels, so the service can dead-letter it
        records.append((topic, key, orjson.dumps(event)))
    return records


async def publish(settings: Settings, bootstrap: str, records: list[tuple[str, bytes | None, bytes]],
                  progress=None) -> str | None:
    """Publish records in order per partition; return the freshness token covering them."""
    await ensure_topics(settings, bootstrap)
    prod = producer(bootstrap, settings.kafka.client_kwargs())
    await prod.start()
    offsets: dict[str, dict[int, int]] = {}
    try:
        futures = []
        for topic, key, value in records:
            if topic == "clock":
                # One tick per partition, so every worker's share of the clock advances.
                parts = await prod.partitions_for(settings.topic(topic))
                for p in sorted(parts):
                    futures.append((topic, await prod.send(settings.topic(topic), value, key=None, partition=p)))
            else:
                futures.append((topic, await prod.send(settings.topic(topic), value, key=key)))
        for done, (topic, fut) in enumerate(futures, start=1):
            meta = await fut
            parts = offsets.setdefault(topic, {})
            parts[meta.partition] = max(parts.get(meta.partition, 0), meta.offset + 1)
            if progress:
                progress(done, len(futures))
    finally:
        await prod.stop()
    cluster_id = await read_cluster_id(bootstrap, **settings.kafka.client_kwargs())
    return sign_offsets(settings, offsets, cluster_id)


def sign_offsets(settings: Settings, offsets: dict[str, dict[int, int]], cluster_id: str | None) -> str | None:
    """A token for what was published, signed with the workers' current key; None (and why, logged) without it."""
    try:
        keys = TokenKeys(settings.token_keys_path)
        keys.load()
    except TokenKeyError as exc:
        log.warning("no freshness token for what was published: %s (workers sign and check tokens with that file; "
                    "run this where it is readable, or set FRESHPLAN_TOKEN_KEY_FILE)", exc)
        return None
    return encode_token(offsets, cluster_id, key=keys.sign_with())


def load_file(settings: Settings, bootstrap: str, path: Path, progress=None) -> tuple[int, str | None]:
    """Publish one scenario file; return (events published, freshness token)."""
    records = read_scenario(path)
    token = asyncio.get_event_loop().run_until_complete(publish(settings, bootstrap, records, progress))
    log.info("published %d events from %s", len(records), path)
    return len(records), token
