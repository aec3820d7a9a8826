"""Wire a worker: Faust agents for the input topics, the outbox publisher, timers and routes."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timezone

import faust
import orjson
from aiokafka.errors import MessageSizeTooLargeError, RecordTooLargeError

from agents.invalidation import Invalidator, RawMessage
from agents.query import QueryService
from agents.lag import LagWatcher
from agents.metrics import Metrics
from agents.routes import register_routes
from schemas.timefmt import format_instant
from state.local_state import LocalState
from streams.app import create_app
from streams.settings import INPUT_TOPICS, Settings
from streams.topics import Topics, declare_topics

log = logging.getLogger(__name__)

PERMANENT_SEND_ERRORS = (MessageSizeTooLargeError, RecordTooLargeError)


@dataclass
class Worker:
    """One freshplan worker: its app, topics, local state and services."""

    settings: Settings
    app: faust.App
    topics: Topics
    state: LocalState
    invalidator: Invalidator
    query: QueryService
    publish_lock: asyncio.Lock
    guard: LagWatcher
    metrics: Metrics

    async def publish_outbox(self) -> int:
        """Send queued records, wait for the broker's acknowledgements, then forget them.

        A record the broker can never accept (too large) is logged and dropped so that it cannot
        block the queue; records that failed for a transient reason stay queued for the next flush.
        """
        sent = 0
        async with self.publish_lock:
            while True:
                rows = self.state.outbox.pending()
                if not rows:
                    return sent
                futures = [await self.app.producer.send(topic, key, value, partition=None,
                                                        timestamp=None, headers=None)
                           for _, topic, key, value in rows]
                results = await asyncio.gather(*futures, return_exceptions=True)
                done, retry = [], 0
                for (seq, topic, key, _), result in zip(rows, results, strict=True):
                    if not isinstance(result, BaseException):
                        done.append(seq)
                    elif isinstance(result, PERMANENT_SEND_ERRORS):
                        log.error("dropping an unpublishable record for %s (key %r): %r", topic, key, result)
                        done.append(seq)
                    else:
                        retry += 1
                with self.state.store.transaction():
                    self.state.outbox.remove(done)
                sent += len(done)
                if retry:
                    log.warning("%d records not acknowledged; they stay queued", retry)
                    return sent


def build_worker(settings: Settings, bootstrap_servers: str) -> Worker:
    """Create the app and register everything on it; nothing runs until the app starts."""
    app = create_app(settings, bootstrap_servers)
    topics = declare_topics(app, settings)
    state = LocalState.open(settings.db_path)
    invalidator = Invalidator(state, settings.topic, settings.max_event_bytes)
    guard = LagWatcher(state.store, bootstrap_servers, {name: settings.topic(name) for name in INPUT_TOPICS},
                       settings.revocation_lag_bound)
    query = QueryService(state, invalidator, guard)
    metrics = Metrics(state, query, guard)
    invalidator.on_latency = metrics.event_to_invalidation.observe
    invalidator.on_compile = metrics.compile_seconds.labels("recompile").observe
    query.on_compile = metrics.compile_seconds.labels("select").observe
    worker = Worker(settings, app, topics, state, invalidator, query, asyncio.Lock(), guard, metrics)

    for name in INPUT_TOPICS:
        _register_input_agent(worker, name)

    @app.task
    async def watch_revocations() -> None:
        # A task, not a timer: the first reading happens at start-up, not one interval later.
        try:
            while True:
                await guard.refresh()
                await asyncio.sleep(guard.poll_interval)
        finally:
            await guard.stop()

    @app.timer(interval=1.0)
    async def flush_outbox() -> None:
        # Catches records left by a crash between commit and publish, and idle periods.
        await worker.publish_outbox()

    if settings.wall_clock:
        @app.timer(interval=settings.wall_clock_interval)
        async def wall_clock_tick() -> None:
            now = format_instant(datetime.now(timezone.utc).replace(microsecond=0))
            value = orjson.dumps({"event_id": f"wall-{now}", "schema_version": 1,
                                  "occurred_at": now, "now": now})
            clock = topics["clock"]
            await asyncio.gather(*[await app.producer.send(clock.get_topic_name(), None, value, partition=p,
                                                           timestamp=None, headers=None)
                                   for p in range(settings.partitions)])

    register_routes(app, worker)
    return worker


def _register_input_agent(worker: Worker, name: str) -> None:
    topic = worker.topics[name]
    settings = worker.settings

    async def consume(stream) -> None:
        async for events in stream.take_events(settings.batch_size, within=settings.batch_window):
            batch = [RawMessage(name, e.message.partition, e.message.offset, e.message.key, e.message.value,
                                e.message.timestamp) for e in events]
            worker.invalidator.apply(batch)
            await worker.publish_outbox()

    consume.__name__ = f"apply_{name.replace('-', '_')}"
    consume.__qualname__ = consume.__name__
    worker.app.agent(topic, name=f"freshplan.agents.{consume.__name__}")(consume)
