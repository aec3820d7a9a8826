"""Wire a worker: Faust agents for the input topics, the replica, the writer thread, timers and routes."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from datetime import datetime, timezone
from typing import Callable

import orjson

from agents.web.access import Access
from agents.plans.backlog import announcements_out, pass_plans, recompile_queued
from agents.plans.successor_hold import SuccessorHold
from agents.ops.chores import Chores
from agents.web.gate import Gate, api_routes
from agents.stream.duty import Duty, TakenOn, register_duty
from agents.stream.rebalances import Rebalances
from agents.stream.event_apply import EventApplier
from agents.stream.fast_path import FastPath
from agents.plans.plan_writer import PlanWriter
from agents.web.early_waits import EarlyWaits
from agents.web.forward import is_self, owners
from agents.web.peers import Peers
from agents.web.query import QueryService
from agents.stream.lag import LagWatcher
from agents.ops.collector import Collector
from agents.ops.loop_probe import LoopProbe
from agents.web.metrics import Metrics, Observations
from agents.plans.ownership import Ownership
from agents.stream.plan_feed import PlanFeed
from agents.stream.publisher import Publisher
from agents.stream.replica import Replica
from agents.stream.route_source import RouterReader, SourceRouter
from agents.stream.router import Router
from agents.ops.retention import BATCH, RetentionTimer
from agents.web.routes import register_routes
from agents.shards.lane_reports import REPORT_EVERY, LaneReports
from agents.shards.peer_watch import PeerWatch
from agents.shards.shard_follow import ShardFollower
from agents.shards.shard_restore import Shards
from agents.stream.writer import Writer
from agents.worker.runtime import Worker
from compiler.request import Limits
from schemas.cdc_mapping import CdcMapping
from schemas.codec import decode
from schemas.timefmt import format_instant
from state.local_state import LocalState
from state.outbox import OutboundLimit
from state.parked_plans import ParkedPlans
from state.shard_state import ShardState
from state.retention import RetentionPolicy, Topics as RetentionTopics
from streams.admin import GroupOffsets
from streams.app import create_app
from streams.settings import INPUT_TOPICS, Settings
from streams.topics import declare_topics

log = logging.getLogger(__name__)

IDLE_SECONDS = 1.0  # no input batch applied for this long: the writer may checkpoint the file

def build_worker(settings: Settings, bootstrap_servers: str, access: Access | None = None,
                 cdc: CdcMapping | None = None) -> Worker:
    """Create the app and register everything on it; nothing runs until the app starts."""
    access = access or Access.closed()
    kafka = settings.kafka.client_kwargs()
    gate = Gate(settings, access.callers, access.jwt, api_routes(settings))
    app = create_app(settings, bootstrap_servers, [gate.middleware])
    topics = declare_topics(app, settings)
    outbound = OutboundLimit(settings.max_record_bytes, settings.topic("dead-letters"),
                             frozenset({settings.topic("plans"), settings.topic("receipts"),
                                        settings.topic("plan-dependencies")}))
    state = LocalState.open(settings.db_path, outbound, wal_limit=settings.wal_limit_mb * 2**20)
    shard_state = ShardState(state.store, settings.partitions)
    reader = state.reader()
    observed = Observations()  # first: what it observes is handed its callbacks when built
    writer, chores, collector = Writer(), Chores(), Collector(settings.gc_freeze).install()
    probe = LoopProbe(on_sample=observed.observe_loop)
    # Announces from memory what a fetched edit makes stale; the names it calls are bound below.
    early = FastPath(state.store.heads, owns=lambda entity_id: ownership.owns(entity_id),
                     send=lambda topic, key, value: app.producer.send(topic, key, value, partition=None,
                                                                      timestamp=None, headers=None),
                     topic_of=settings.topic,
                     decode=lambda m: decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}",
                                             max_bytes=settings.max_event_bytes, cdc=cdc),
                     applied=lambda topic, partition, offset: replica.applied(topic, partition, offset),
                     event_time=lambda: applier.now, behind=lambda: replica.behind())
    plan_writer = PlanWriter(state, settings.topic, eager_limit=settings.eager_recompile_limit,
                             on_compile=observed.recompiled, on_latency=observed.event_to_invalidation.observe,
                             sent_early=early.acknowledged, partitions=settings.partitions)
    applier = EventApplier(state, plan_writer, settings.max_event_bytes, max_clock_jump=settings.max_clock_jump,
                           cdc=cdc, max_event_skew=settings.max_event_skew, mine=shard_state.mine,
                           owns=shard_state.owns, early=early.announced, lane_of=shard_state.lane_of,
                           owns_lane=shard_state.owns_lane)
    # The embedded broker keeps topics in memory: every start is a reset that must be rebased.
    inputs = {name: settings.topic(name) for name in INPUT_TOPICS}
    rebalances = Rebalances(app, inputs)
    taken_on = TakenOn()  # the duty fills it, the publisher publishes from it
    publisher = Publisher(state, app, writer.run, taken_on.by_topic, prefetching=True)
    shards = Shards(shard_state, applier, standby_replicas=settings.standby_replicas,
                    reading=lambda: replica.lanes.read_now())
    # `source-changes` is read through its lanes (named here so that a reset of it is still detected).
    lanes = {name: settings.topic(name) for name in ("shared-changes", "entity-changes")}
    replica = Replica(applier, reader.store, bootstrap_servers, {**inputs, **lanes},
                      settings.batch_size, settings.batch_window, max(2 * settings.max_event_bytes, 1_000_000),
                      after_apply=publisher.publish_owned,
                      auto_rebase=settings.rebase or settings.bootstrap_servers is None, kafka=kafka, run=writer.run,
                      on_batch=observed.observe_batch, early=early, partitions=settings.partitions,
                      held_lanes=lambda: shard_state.held, lanes_applied=shards.lanes_applied,
                      after_commit=publisher.prefetched.read if publisher.prefetched else None)
    # Replaced (never changed in place) after each committed batch.
    positions = lambda: replica.positions  # noqa: E731
    guard = LagWatcher(reader.store, bootstrap_servers, inputs, settings.revocation_lag_bound, kafka=kafka,
                       paused=replica.paused, blocked=replica.blocked, applied=positions)
    parked = ParkedPlans(state.store, settings.partitions)
    ownership = Ownership(state, plan_writer, state.key_changes, parked, settings.partitions,
                          settings.topic("plan-dependencies"), shards=shards)
    plan_feed = PlanFeed(state, ownership, parked, replica, bootstrap_servers, settings.topic("plan-dependencies"),
                         keeps=lambda: shard_state.held | shard_state.catching | shards.starting,
                         after_apply=publisher.kick, kafka=kafka, run=writer.run)
    peers = Peers(served_by=str(app.conf.canonical_url), foreign_partition=ownership.foreign_partition,
                  foreign_partitions=lambda: sorted(set(range(settings.partitions)) - set(ownership.owned or ())))
    query = QueryService(reader, plan_writer, guard, peers=peers, tokens=access.token_keys, position=positions,
                         limits=Limits(query_bytes=settings.max_query_bytes, tokens=settings.max_budget_tokens,
                                       calls=settings.max_budget_calls),
                         last_events=applier.last_event, on_compile=observed.selected,
                         check_heads=settings.check_head_cache,
                         early=EarlyWaits(early.waiting, replica.wait_applied, early.was_announced,
                                           settings.freshness_wait))
    metrics = Metrics(reader, query, guard, probe, collector, chores, observed=observed)
    group_offsets = GroupOffsets(bootstrap_servers, settings.app_id, kafka)
    duty = Duty(state, app, writer.run, inputs, group_offsets, kick=publisher.kick,
                verified=lambda: replica.ready.is_set() and not replica.blocked, assignment=rebalances.keys,
                floors=taken_on)
    route = SourceRouter(Router(settings.partitions,
                                lambda m: decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}",
                                                 max_bytes=settings.max_event_bytes, cdc=cdc),
                                # a Kafka record's own overhead (no key, no headers) stays well under 512 bytes
                                max_bytes=max(1024, settings.max_record_bytes - 512)),
                         lambda topic, partition, value: app.producer.send(settings.topic(topic), None, value,
                                                                           partition=partition, timestamp=None,
                                                                           headers=None),
                         replica.sent)
    reports = LaneReports(shard_state, state, writer.run_later,
                          lambda lane, value, headers: app.producer.send(settings.topic("entity-changes"), None, value,
                                                                         partition=lane, timestamp=None,
                                                                         headers=headers),
                          settings.topic("dead-letters"))
    hold = SuccessorHold(replica.input_waiting)
    stopping = threading.Event()
    worker = Worker(settings, app, topics, state, applier, query, publisher, guard, metrics,
                    replica, plan_feed, writer, reader, probe, ownership, duty, collector, chores, router=route,
                    lane_reports=reports, successor_hold=hold, stopping=stopping)

    for name in INPUT_TOPICS:
        _register_input_agent(worker, name)  # paused: they subscribe the group (the duty); the readers read
    router = RouterReader(route, bootstrap_servers, settings.topic("source-changes"),
                          lambda: taken_on.by_topic().get("source-changes", {}), settings.batch_size,
                          settings.batch_window, kafka)

    @app.task
    async def route_source_changes() -> None:
        await router.run()
    register_duty(app, duty, chores, rebalances.waker())

    @app.task
    async def watch_revocations() -> None:
        # In a thread of its own (first reading at start-up): a busy loop must not make the guard
        # look stale and refuse healthy selects.
        guard.start_thread()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.to_thread(guard.stop_thread)

    app.task(chores.loop("probe_loop", probe.run))

    @app.task
    async def apply_replica() -> None:
        await replica.run()

    @app.task
    async def adopt_plans() -> None:
        await plan_feed.run()

    follower = ShardFollower(rebalances, replica, shards, ownership, writer.run, publisher.publish, plan_feed,
                             stall_seconds=settings.restore_stall_seconds, read_ahead=settings.read_ahead)
    app.task(follower.run)
    if settings.read_ahead and replica.routed:
        watch = PeerWatch(shards, lambda: owners(app, settings.topic("source-changes")),
                          lambda url: is_self(app, url), rebalances.wake)
        app.task(chores.loop("peer_watch", watch.step))

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
            await publisher.publish()
        return 0 if done else 0.05

    app.task(chores.loop("recompile_backlog", recompile_backlog))

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

    retention = RetentionTimer(state, query, RetentionPolicy(settings.plan_retention, settings.receipt_retention,
                                                             BATCH, settings.event_id_retention),
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

    @app.timer(interval=REPORT_EVERY)
    @chores.timer("report_lanes")
    async def report_lanes() -> None:
        # A worker gaining one of these lanes dead-letters again the refusals no report covers.
        if replica.ready.is_set() and not replica.blocked:
            await reports.report()

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

    if settings.wall_clock:
        @app.timer(interval=settings.wall_clock_interval)
        @chores.timer("wall_clock_tick")
        async def wall_clock_tick() -> None:
            wall = datetime.now(timezone.utc).replace(microsecond=0)
            if applier.now is not None and applier.now >= wall:
                return  # event time is past the wall: the tick would only be dead-lettered as a regression
            now = format_instant(wall)
            value = orjson.dumps({"event_id": f"wall-{now}", "schema_version": 1,
                                  "occurred_at": now, "now": now})
            clock = topics["clock"]
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

    register_routes(app, worker.api(), access)
    return worker


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
