"""Wire a worker: its state, the apply path, the readers and the query service (tasks in `loops`, routes in `web`)."""

from __future__ import annotations

import threading

from agents.web.access import Access
from agents.plans.successor_hold import SuccessorHold
from agents.ops.chores import Chores
from agents.web.gate import Gate, api_routes
from agents.stream.duty import Duty, TakenOn
from agents.stream.rebalances import Rebalances
from agents.stream.event_apply import EventApplier
from agents.stream.fast_path import FastPath
from agents.plans.plan_writer import PlanWriter
from agents.web.early_waits import EarlyWaits
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
from agents.web.routes import register_routes
from agents.shards.lane_reports import LaneReports
from agents.shards.shard_restore import Shards
from agents.stream.writer import Writer
from agents.worker.loops import register_loops
from agents.worker.runtime import Worker
from compiler.request import Limits
from schemas.cdc_mapping import CdcMapping
from schemas.codec import decode
from state.local_state import LocalState
from state.outbox import OutboundLimit
from state.parked_plans import ParkedPlans
from state.shard_state import ShardState
from streams.admin import GroupOffsets
from streams.app import create_app
from streams.settings import INPUT_TOPICS, Settings
from streams.topics import declare_topics

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

    def decode_input(m):
        return decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}",
                      max_bytes=settings.max_event_bytes, cdc=cdc)
    # Announces from memory what a fetched edit makes stale; the names it calls are bound below.
    early = FastPath(state.store.heads, owns=lambda entity_id: ownership.owns(entity_id),
                     send=lambda topic, key, value: app.producer.send(topic, key, value, partition=None,
                                                                      timestamp=None, headers=None),
                     topic_of=settings.topic,
                     decode=decode_input,
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
    route = SourceRouter(Router(settings.partitions, decode_input,
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

    router = RouterReader(route, bootstrap_servers, settings.topic("source-changes"),
                          lambda: taken_on.by_topic().get("source-changes", {}), settings.batch_size,
                          settings.batch_window, kafka)
    register_loops(worker, rebalances, router, group_offsets, access)
    register_routes(app, worker.api(), access)
    return worker

