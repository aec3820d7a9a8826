"""The worker's tasks and timers, registered on its app: the readers, the successor backlog and housekeeping."""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import datetime, timezone
from typing import Callable

import orjson

from agents.ops.retention import BATCH, RetentionTimer
from agents.plans.backlog import announcements_out, pass_plans, recompile_queued
from agents.shards.lane_reports import REPORT_EVERY
from agents.shards.peer_watch import PeerWatch
from agents.shards.shard_follow import ShardFollower
from agents.stream.duty import register_duty
from agents.stream.rebalances import Rebalances
from agents.stream.route_source import RouterReader
from agents.stream.writer import Writer
from agents.web.access import Access
from agents.web.forward import is_self, owners
from agents.worker.runtime import Worker
from schemas.timefmt import format_instant
from state.local_state import LocalState
from state.retention import RetentionPolicy, Topics as RetentionTopics
from streams.admin import GroupOffsets
from streams.settings import INPUT_TOPICS

log = logging.getLogger(__name__)

IDLE_SECONDS = 1.0  # no input batch applied for this long: the writer may checkpoint the file


def register_loops(worker: Worker, rebalances: Rebalances, router: RouterReader, group_offsets: GroupOffsets,
                   access: Access) -> None:
    """Register every task and timer of a built worker; nothing runs until its app starts."""
    for name in INPUT_TOPICS:
        _register_input_agent(worker, name)  # paused: they subscribe the group (the duty); the readers read
    _register_readers(worker, rebalances, router)
    _register_backlog(worker)
    _register_housekeeping(worker, group_offsets)
    _register_ticks(worker, access)


def _register_readers(worker: Worker, rebalances: Rebalances, router: RouterReader) -> None:
    """The loops that read the topics: router, duty, revocation guard, replica, plan feed, shard follower."""
    app, settings, chores, replica = worker.app, worker.settings, worker.chores, worker.replica
    guard, shards = worker.guard, worker.ownership.shards

    @app.task
    async def route_source_changes() -> None:
        await router.run()
    register_duty(app, worker.input_duty, chores, rebalances.waker())

    @app.task
    async def watch_revocations() -> None:
        # In a thread of its own (first reading at start-up): a busy loop must not make the guard
        # look stale and refuse healthy selects.
        guard.start_thread()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.to_thread(guard.stop_thread)

    app.task(chores.loop("probe_loop", worker.probe.run))

    @app.task
    async def apply_replica() -> None:
        await replica.run()

    @app.task
    async def adopt_plans() -> None:
        await worker.plan_feed.run()

    follower = ShardFollower(rebalances, replica, shards, worker.ownership, worker.writer.run,
                             worker.publisher.publish, worker.plan_feed,
                             stall_seconds=settings.restore_stall_seconds, read_ahead=settings.read_ahead)
    app.task(follower.run)
    if settings.read_ahead and replica.routed:
        watch = PeerWatch(shards, lambda: owners(app, settings.topic("source-changes")),
                          lambda url: is_self(app, url), rebalances.wake)
        app.task(chores.loop("peer_watch", watch.step))


def _register_backlog(worker: Worker) -> None:
    """The loop that compiles queued successors in small writer jobs, after their announcements are out."""
    app, chores, settings, replica, writer, reader = (worker.app, worker.chores, worker.settings, worker.replica,
                                                      worker.writer, worker.reader)
    plan_writer, ownership, hold, stopping = (worker.applier.plans, worker.ownership, worker.successor_hold,
                                              worker.stopping)

    def recompile_owned(limit: int) -> int | None:
        # Checked on the writer, where `owned` changes. Before the first assignment the queue read from
        # the file may name plans a peer owns now (its successors would fork the owner's lineage); the
        # first `follow` hands those back, queue entries included, so from then on it holds owned plans only.
        if not ownership.assigned:
            return 0
        if hold.holding(job=True):  # None: held for the input batch about to be applied
            return None
        return recompile_queued(plan_writer, limit) if announcements_out(plan_writer) else 0

    async def recompile_backlog() -> float:
        # Successors of fan-outs announced first; small steps keep the loop responsive, and
        # announcements still waiting in the outbox go out before any successor is compiled (the
        # writer job judges that: it alone sees a fan-out committed just now).
        if not plan_writer.queue_pending or stopping.is_set():  # set by every path that queues plans; a stop
            return 0.1  # leaves the queue in the file: the restarted worker or the partition's next owner compiles it
        waits_for = plan_writer.backlog_waits_for  # no writer job while those records are still due
        if not ownership.assigned or (waits_for is not None and reader.outbox.last_due(waits_for) is not None):
            return 0.05
        if hold.holding():
            await replica.batch_applied(hold.left())
            return 0
        # A select's compile or an apply batch goes first; with no input to hold up, bigger steps drain it sooner.
        idle = asyncio.get_running_loop().time() - replica.applied_at if replica.quiet() else 0.0
        limit = pass_plans(replica.catching_up(), idle, settings.backlog_step)
        done = await writer.run_later(functools.partial(recompile_owned, limit))
        if done is None:
            await replica.batch_applied(hold.left())
            return 0
        if done:
            await worker.publisher.publish()
        return 0 if done else 0.05

    app.task(chores.loop("recompile_backlog", recompile_backlog))


def _register_housekeeping(worker: Worker, group_offsets: GroupOffsets) -> None:
    """Timers that keep the file and the outbox in shape: prune, retention, checkpoints, counts, flushes."""
    app, settings, chores, state = worker.app, worker.settings, worker.chores, worker.state
    replica, writer, publisher = worker.replica, worker.writer, worker.publisher

    @app.task
    async def close_on_stop() -> None:
        # Timers cannot clean up after themselves: their client is closed when the app's tasks are cancelled.
        try:
            await asyncio.Event().wait()
        finally:
            await group_offsets.close()

    @app.timer(interval=5.0)
    @chores.timer("prune_standby")
    async def prune_standby() -> None:
        # Standby rows of partitions this worker never owns would otherwise pile up. Not before the
        # replica's offsets are this broker's, nor for a topic blocked on a reset: rows of an older
        # incarnation are the rebase's to release (the other topics are still applied, and pile up).
        if not replica.ready.is_set():
            return
        try:
            committed = await group_offsets.read({settings.topic(n): n for n in INPUT_TOPICS})
        except Exception as exc:  # noqa: BLE001 - pruning is housekeeping; it must never stop the worker
            log.warning("could not read the group's committed offsets: %r", exc)
            await group_offsets.close()
            return
        await writer.run_later(_prune, state, committed, frozenset(replica.blocked))

    retention = RetentionTimer(state, worker.query,
                               RetentionPolicy(settings.plan_retention, settings.receipt_retention, BATCH,
                                               settings.event_id_retention),
                               RetentionTopics(settings.topic("plan-invalidations"), settings.topic("plans"),
                                               settings.topic("clock"), settings.topic("plan-dependencies"),
                                               settings.partitions))

    @app.timer(interval=settings.retention_interval)
    @chores.timer("enforce_retention")
    async def enforce_retention() -> None:
        # Evictions are announced by the worker that makes them (see RetentionTimer).
        result = await retention.run(writer.run_later)
        if result is not None and result.evicted:
            await publisher.publish()

    checkpointing: list[asyncio.Future] = []

    @app.timer(interval=1.0)
    async def checkpoint_when_idle() -> None:
        # A checkpoint stops the writer for as long as it rewrites the file's indexes (see
        # state.checkpoints): taken after a quiet second, it delays no event that was waiting.
        # Not awaited here: behind a long writer job the timer would overrun its interval.
        if checkpointing and not checkpointing[0].done():
            return
        if asyncio.get_running_loop().time() - replica.applied_at >= IDLE_SECONDS:
            checkpointing[:] = [asyncio.ensure_future(_checkpoint(writer, state, replica.quiet))]

    @app.timer(interval=1.0)
    @chores.timer("write_counts")
    async def write_counts() -> None:
        # Counter increments wait in memory between these writes (see state.counts): a kill -9 loses about 2 s.
        if state.store.counts.due():
            await writer.run_later(state.store.write_counts)

    @app.timer(interval=1.0)
    @chores.timer("flush_outbox")
    async def flush_outbox() -> None:
        # Catches records left by a crash between commit and publish, and idle periods.
        await publisher.publish()
        await publisher.forget_acknowledged()


def _register_ticks(worker: Worker, access: Access) -> None:
    """Timers that act on time or files: lane reports, the wall clock's ticks, the callers file."""
    app, settings, chores, replica = worker.app, worker.settings, worker.chores, worker.replica
    reports = worker.lane_reports

    @app.timer(interval=REPORT_EVERY)
    @chores.timer("report_lanes")
    async def report_lanes() -> None:
        # A worker gaining one of these lanes dead-letters again the refusals no report covers.
        if reports is not None and replica.ready.is_set() and not replica.blocked:
            await reports.report()

    if settings.wall_clock:
        @app.timer(interval=settings.wall_clock_interval)
        @chores.timer("wall_clock_tick")
        async def wall_clock_tick() -> None:
            wall = datetime.now(timezone.utc).replace(microsecond=0)
            if worker.applier.now is not None and worker.applier.now >= wall:
                return  # event time is past the wall: the tick would only be dead-lettered as a regression
            now = format_instant(wall)
            value = orjson.dumps({"event_id": f"wall-{now}", "schema_version": 1,
                                  "occurred_at": now, "now": now})
            clock = worker.topics["clock"]
            # Only the owner of a clock partition ticks it: workers' wall clocks must not interleave.
            await asyncio.gather(*[await app.producer.send(clock.get_topic_name(), None, value, partition=p,
                                                           timestamp=None, headers=None)
                                   for p in worker.duty().get("clock", [])])

    if access.reload is not None:
        @app.timer(interval=1.0)
        @chores.timer("reload_callers")
        async def reload_callers() -> None:
            # Polling a small file once a second applies an edit within the promised 5 s on any filesystem.
            access.reload()


async def _checkpoint(writer: Writer, state: LocalState, quiet: Callable[[], bool]) -> None:
    try:
        await writer.run_later(state.store.checkpoints.when_idle, still_idle=quiet)
    except Exception:  # noqa: BLE001 - housekeeping: a failure must never stop the worker; the next second retries
        log.exception("checkpointing the state file failed; retrying when idle")


def _register_input_agent(worker: Worker, name: str) -> None:
    # Without acks Faust never commits these topics: only `Duty` does, to what was published.
    topic = worker.topics[name].clone(acks=False)
    settings = worker.settings

    async def consume(stream) -> None:
        # The agent subscribes the group to the topic: the assignment is the duty, which `Duty`
        # serves from the replica, keeping these partitions paused. What Faust fetched before a
        # pause took effect is counted and dropped (the replica applies it, `Duty` publishes it).
        async for events in stream.take_events(settings.batch_size, within=settings.batch_window):
            worker.input_duty.delivered += len(events)

    consume.__name__ = f"apply_{name.replace('-', '_')}"
    consume.__qualname__ = consume.__name__
    worker.app.agent(topic, name=f"freshplan.agents.{consume.__name__}")(consume)


def _prune(state: LocalState, committed: dict[tuple[str, int], int], blocked: frozenset[str] = frozenset()) -> None:
    committed = {key: offset for key, offset in committed.items() if key[0] not in blocked}
    with state.store.transaction():
        state.outbox.prune(committed)
