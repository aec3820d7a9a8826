"""A subscriber-side plan cache kept coherent by `plans` and `plan-invalidations` (for gateways and caches)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from streams.settings import heartbeat_interval

log = logging.getLogger(__name__)

_DDL = """
CREATE TABLE IF NOT EXISTS plans (plan_id TEXT PRIMARY KEY, plan BLOB);
CREATE TABLE IF NOT EXISTS invalidated (plan_id TEXT PRIMARY KEY, successor TEXT, reason TEXT);
CREATE TABLE IF NOT EXISTS causes (cause TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS keyed (plan_id TEXT PRIMARY KEY, plan_key TEXT, as_of TEXT);
CREATE TABLE IF NOT EXISTS awaiting (plan_id TEXT PRIMARY KEY, plan_key TEXT, topic TEXT, part INTEGER, past INTEGER);
"""


class PlanCache:
    """Plans by id, minus every plan announced invalid; persisted so a restart resumes where it stopped.

    Invalidations are idempotent by cause (plan, event, dependency key): a redelivered or
    republished announcement changes nothing. Offsets are committed to Kafka only after the
    batch is in the local file, so a crash re-reads rather than skips.
    """

    def __init__(self, bootstrap_servers: str, *, group_id: str, path: Path | str, topic_prefix: str = "",
                 kafka: dict[str, Any] | None = None, session_timeout: float | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.kafka = kafka or {}  # KafkaSecurity.client_kwargs() of the subscriber
        self.session_timeout = session_timeout
        """Seconds, or None for aiokafka's 10: the embedded broker holds a join for half of it, so a cache on it
        starts that much sooner with the workers' 4 s (Apache Kafka refuses under 6 by default)."""
        self.group_id = group_id
        self.topics = {f"{topic_prefix}plans": "plans", f"{topic_prefix}plan-invalidations": "plan-invalidations"}
        self.topic_prefix = topic_prefix
        self.db = sqlite3.connect(str(path))
        self.db.executescript(_DDL)
        self.duplicates = 0
        self._consumer: AIOKafkaConsumer | None = None

    # -- reading the cache ----------------------------------------------------------------

    def get(self, plan_id: str) -> dict[str, Any] | None:
        """The plan if it is known and has not been invalidated."""
        row = self.db.execute("SELECT p.plan FROM plans p LEFT JOIN invalidated i USING (plan_id) "
                              "WHERE p.plan_id = ? AND i.plan_id IS NULL", [plan_id]).fetchone()
        return orjson.loads(row[0]) if row else None

    def successor(self, plan_id: str) -> str | None:
        """What replaced an invalidated plan, if announced."""
        row = self.db.execute("SELECT successor FROM invalidated WHERE plan_id = ?", [plan_id]).fetchone()
        return row[0] if row else None

    def is_invalidated(self, plan_id: str) -> bool:
        """Whether an invalidation of this plan has been seen."""
        return self.db.execute("SELECT 1 FROM invalidated WHERE plan_id = ?", [plan_id]).fetchone() is not None

    # -- following the topics ---------------------------------------------------------------

    async def start(self) -> None:
        """Join the group; resume from its committed offsets (earliest for a new group)."""
        self._consumer = AIOKafkaConsumer(*self.topics, bootstrap_servers=self.bootstrap_servers,
                                          group_id=self.group_id, enable_auto_commit=False,
                                          auto_offset_reset="earliest", **self._group_timing(), **self.kafka)
        await self._consumer.start()

    def _group_timing(self) -> dict[str, int]:
        if self.session_timeout is None:
            return {}
        return {"session_timeout_ms": round(self.session_timeout * 1000),
                "heartbeat_interval_ms": round(heartbeat_interval(self.session_timeout) * 1000)}

    async def poll(self, timeout_ms: int = 500) -> int:
        """Apply one batch of records; return how many were read."""
        assert self._consumer is not None, "call start() first"
        batch = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=1000)
        records = [m for messages in batch.values() for m in messages]
        with self.db:
            for message in records:
                if message.value is None:  # a tombstone on `plans`: the plan was evicted
                    self.db.execute("DELETE FROM plans WHERE plan_id = ?", [(message.key or b"").decode()])
                    continue
                self._apply(self.topics[message.topic], orjson.loads(message.value))
        if records:
            await self._consumer.commit()
        return len(records)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the topics until `stop` is set."""
        while not stop.is_set():
            await self.poll()

    async def stop(self) -> None:
        """Leave the group and close the file."""
        if self._consumer is not None:
            await self._consumer.stop()
        self.db.close()

    def _apply(self, topic: str, record: dict[str, Any]) -> None:
        if topic == "plans":
            self.db.execute("INSERT OR REPLACE INTO plans VALUES (?, ?)", [record["plan_id"], orjson.dumps(record)])
            self.db.execute("INSERT OR REPLACE INTO keyed VALUES (?, ?, ?)", [
                record["plan_id"], record.get("plan_key"), orjson.dumps(record.get("compiled_as_of") or {}).decode()])
            self._follow_up(record.get("plan_key"))
            return
        if record.get("reason") == "evicted":
            # Unused, not wrong: forget it, so that the same plan id published again is served again.
            self.db.execute("DELETE FROM plans WHERE plan_id = ?", [record["plan_id"]])
            log.info("plan %s evicted", record["plan_id"])
            return
        cause = record.get("cause") or {}
        key = f"{record['plan_id']}|{cause.get('event_id')}|{cause.get('dependency_key')}"
        if self.db.execute("INSERT OR IGNORE INTO causes VALUES (?)", [key]).rowcount == 0:
            self.duplicates += 1
            return
        self.db.execute("INSERT OR REPLACE INTO invalidated VALUES (?, ?, ?)",
                        [record["plan_id"], record.get("successor_plan_id"), record.get("reason")])
        log.info("plan %s invalidated (%s), successor %s", record["plan_id"], record.get("reason"),
                 record.get("successor_plan_id"))
        topic, partition, offset = cause.get("topic"), cause.get("partition"), cause.get("offset")
        if record.get("successor_plan_id") is None and isinstance(offset, int) and offset >= 0 and topic:
            # Announced before its successor was compiled: the successor is the key's plan published on
            # `plans` compiled past the cause (the same plan id when it came out identical: valid again).
            self.db.execute("INSERT OR REPLACE INTO awaiting VALUES (?, ?, ?, ?, ?)", [
                record["plan_id"], record.get("plan_key"), topic.removeprefix(self.topic_prefix), partition,
                offset + 1])
            self._follow_up(record.get("plan_key"))

    def _follow_up(self, plan_key: str | None) -> None:
        """Name the successors of this key's announced plans, among its plans compiled past their causes."""
        waiting = self.db.execute("SELECT plan_id, topic, part, past FROM awaiting WHERE plan_key = ?",
                                  [plan_key]).fetchall()
        if not waiting:
            return
        compiled = [(plan_id, orjson.loads(as_of)) for plan_id, as_of in
                    self.db.execute("SELECT plan_id, as_of FROM keyed WHERE plan_key = ?", [plan_key]).fetchall()]
        for plan_id, topic, partition, past in waiting:
            after = sorted((as_of.get(topic, {}).get(str(partition), -1), successor) for successor, as_of in compiled
                           if as_of.get(topic, {}).get(str(partition), -1) >= past)
            if not after:
                continue
            successor = after[0][1]
            if successor == plan_id:
                self.db.execute("DELETE FROM invalidated WHERE plan_id = ?", [plan_id])
            else:
                self.db.execute("UPDATE invalidated SET successor = ? WHERE plan_id = ?", [successor, plan_id])
            self.db.execute("DELETE FROM awaiting WHERE plan_id = ?", [plan_id])
