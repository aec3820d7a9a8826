"""One running worker: its app, topics, local state and services, and what it tells /healthz."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field

import faust

from agents.plans.successor_hold import SuccessorHold
from agents.ops.chores import Chores
from agents.ops.collector import Collector
from agents.ops.loop_probe import LoopProbe
from agents.plans.ownership import Ownership
from agents.shards.lane_reports import LaneReports
from agents.stream.duty import Duty
from agents.stream.event_apply import EventApplier
from agents.stream.lag import LagWatcher
from agents.stream.plan_feed import PlanFeed
from agents.stream.publisher import Publisher
from agents.stream.replica import Replica
from agents.stream.route_source import SourceRouter
from agents.stream.writer import Writer
from agents.web.forward import forward_request, owner_url
from agents.web.metrics import Metrics
from agents.web.query import QueryService
from agents.web.routes import Api
from agents.web.select_reads import SelectReads
from agents.web.status import Status
from state.local_state import LocalState
from streams.settings import INPUT_TOPICS, Settings
from streams.topics import Topics

log = logging.getLogger(__name__)


@dataclass
class Worker:
    """One freshplan worker: its app, topics, local state and services."""

    settings: Settings
    app: faust.App
    topics: Topics
    state: LocalState
    applier: EventApplier
    query: QueryService
    publisher: Publisher
    """Sends the outbox (its bookkeeping runs on the writer thread)."""
    guard: LagWatcher
    metrics: Metrics
    replica: Replica
    plan_feed: PlanFeed
    writer: Writer
    """The thread that owns the read-write connection: every state write runs there."""
    reader: LocalState
    """Views over a cursor of their own, for what the event loop reads (committed state)."""
    probe: LoopProbe
    """Measures how long the event loop is kept from running."""
    ownership: Ownership
    """The plan partitions this worker owns: it alone indexes, recompiles and announces their plans."""
    input_duty: Duty
    """Takes input partitions on at the group's offset and commits the group's offsets to what was published."""
    collector: Collector
    """Freezes what start-up built out of garbage collection, and measures every collection's pause."""
    chores: Chores
    """Runs the timers and background loops: a failing one is logged, counted and retried, never fatal."""
    router: SourceRouter | None = None
    """Routes the duty's `source-changes` partitions to the lanes (see `agents.stream.route_source`)."""
    lane_reports: LaneReports | None = None
    """Reports how far the owned lanes' refusals were dead-lettered (see `agents.shards.lane_reports`)."""
    successor_hold: SuccessorHold | None = None
    """Whether successors wait for fetched input first (see `agents.plans.successor_hold`)."""
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set as a stop begins: no backlog job starts after it (the queue is in the file for whoever compiles next)."""
    status: Status = field(init=False)
    """Answers /healthz and /metrics, reading the file on a thread of its own (never on the loop)."""
    select_reads: SelectReads = field(init=False)
    """Reads the file for selects the head cache cannot answer, on a thread of its own (never on the loop)."""

    def __post_init__(self) -> None:
        self.status = Status(self.state.reader(), self.query, self.metrics, self.details, self.shard_figures)
        self.select_reads = SelectReads(self.state.reader())

    def shard_figures(self, state: LocalState) -> dict:
        """The /healthz `shard` section, read on the status thread (see `ShardState`)."""
        shards = self.ownership.shards
        # A move runs on the writer meanwhile: `held` grows before its commit and `restoring` clears after it.
        # Read in that order around the file's counts, and again if a move ended in between, so a shard is
        # never shown held and not restoring with the counts of its partial file.
        for _ in range(3):
            moves, restoring, held = shards.state.moves, shards.state.restoring, shards.state.held
            figures = shards.state.figures(state.store, held)
            restoring = restoring | shards.state.restoring
            if moves == shards.state.moves:
                break
        owned = self.ownership.owned
        serving = held - shards.standby
        (plans,) = state.store.db.execute("SELECT count(*) FROM plan_heads").fetchone()
        # Entity partitions are numbered as `plans` is (co-partitioned), and so are the lanes they are read from.
        return {"partitions": {"plans": sorted(serving)}, "owned_partitions": sorted(owned or ()),
                "resources": figures.resources(serving), "entities": figures.entities(serving), "plans": int(plans),
                "restoring": sorted(restoring), "incomplete": sorted(shards.incomplete),
                "by_partition": {str(p): n for p, n in figures.by_partition.items() if p in serving},
                "standby": {"partitions": sorted(shards.standby), "resources": figures.resources(shards.standby),
                            "entities": figures.entities(shards.standby),
                            "by_partition": {str(p): n for p, n in figures.by_partition.items()
                                             if p in shards.standby}},
                "last_restore": shards.last_restore, "read_ahead": dict(shards.read_ahead),
                "suspected": sorted(shards.suspected)}

    def duty(self) -> dict[str, list[int]]:
        """Input partitions the consumer group gave this worker: it publishes what their events cause."""
        logical = {self.settings.topic(name): name for name in INPUT_TOPICS}
        out: dict[str, list[int]] = {}
        try:
            assignment = self.app.consumer.assignment()
        except Exception:  # noqa: BLE001 - before the consumer exists there is no duty
            return out
        for tp in sorted(assignment):
            if tp.topic in logical:
                out.setdefault(logical[tp.topic], []).append(tp.partition)
        return out

    def api(self) -> Api:
        """The narrow view of this worker that its HTTP routes get."""
        reader = self.reader
        return Api(settings=self.settings, query=self.query,
                   select=lambda body: self.query.select_async(body, self.writer.run_first, self.select_reads.run,
                                                                self.publisher.published),
                   applied=lambda: self.replica.positions, incarnation=reader.store.incarnation,
                   incarnation_checked=self._incarnation_checked,
                   receipt=reader.plans.receipt, pause=self.replica.pause,
                   resume=self.replica.resume, check_ready=self.guard.check, render_metrics=self.status.metrics_text,
                   health=self.status.health, owner_url=self.owner_url, forward=self._forward,
                   plan_status=lambda plan_id, may: self.query.plan_status_async(plan_id, self.status.read, may),
                   owners_known=lambda: self.ownership.assigned,
                   restoring=self.ownership.shards.refusing)

    def owner_url(self, partition: int) -> str | None:
        """URL of the worker the consumer group gave a plan partition (the same partition of the inputs)."""
        return owner_url(self.app, self.settings.topic("source-changes"), partition)

    async def _forward(self, url: str, path: str, body, headers) -> tuple[int, dict]:
        return await forward_request(url, path, body, headers, timeout=self.settings.freshness_wait + 5.0)

    async def _incarnation_checked(self) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(self.replica.ready.wait()), self.settings.freshness_wait)
        except asyncio.TimeoutError:
            return False
        return True

    def details(self, figures: dict) -> dict:
        """Health details of the worker itself (duty, standby outbox, who writes, loop stalls), given the file's."""
        owned = self.ownership.owned
        figures = dict(figures)
        shard = figures.pop("shard", None)
        if shard is not None:
            # Who holds every entity partition, as the group's assignment says (`freshplan status` lists it).
            shard["owners"] = {str(p): self.owner_url(p) for p in range(self.settings.partitions)}
        return {"shard": shard, "duty": self.duty(), "duty_committed": self.input_duty.committed_by_topic(),
                "inputs_from_faust": self.input_duty.delivered,
                "routing": self.routing(),
                "owned_partitions": None if owned is None else sorted(owned),
                "ownership_failures": self.ownership.failures,
                "parked_plans": figures["parked_plans"], "standby_outbox": figures["standby_outbox"],
                # announced plans whose successors the backlog has not compiled yet
                "recompile_queue": figures["recompile_queue"],
                # successors that waited for fetched input first (`agents.plans.successor_hold`)
                "successor_holds": self.successor_hold.as_dict() if self.successor_hold else None,
                "writer": {"thread": self.applier.applied_in, "jobs": self.writer.jobs},
                # flushes that sent what the last apply job read of the outbox, and reads found stale or failed
                "outbox_prefetches": dict(self.publisher.prefetched.counts) if self.publisher.prefetched else None,
                "select_reads": self.select_reads.reads,
                "select_compiles": {"jobs": self.query.compiles.jobs, "selects": self.query.compiles.items,
                                    "waiting": self.query.compiles.waiting},
                "early_announcements": self.replica.early.figures() if self.replica.early else None,
                **self.probe.as_dict(),
                "gc": self.collector.as_dict(), "checkpoints": self.state.store.checkpoints.as_dict(),
                "background_jobs": self.chores.as_dict()}

    def routing(self) -> dict | None:
        """What this worker routed and which lanes it reads (the catching-up ones apart)."""
        if self.router is None:
            return None
        catching = self.ownership.shards.state.catching
        return {"routed": self.router.routed, "batches_sent": self.router.batches, "failures": self.router.failures,
                "notices": self.router.router.notices, "unplaced": self.router.router.unplaced,
                "lanes": sorted(self.replica.reading_lanes() - catching), "catching_up": sorted(catching),
                "lane_records_skipped": self.replica.lanes.errors, "batches_merged_as_sent": self.replica.lanes.fed,
                "merged_batches_passed_unread": self.replica.lanes.passed_fed,
                "lane_reports": self.lane_reports.figures() if self.lane_reports is not None else None}

    def _forget_acknowledged(self) -> None:
        """Delete the rows of records the broker acknowledged: a clean stop sends nothing twice after its restart."""
        outbox = self.state.outbox
        try:
            with self.state.store.transaction():
                forgotten = outbox.forget_acked()
        except Exception:  # noqa: BLE001 - they stay queued and go out again after the restart (at least once)
            log.exception("could not forget %d acknowledged records before closing", len(outbox.acked))
            return
        outbox.acked.deleted(forgotten)

    def close(self) -> None:
        """Let the writer finish its job, then close the file (after the app has stopped)."""
        self.writer.close()
        self.status.close()
        self.select_reads.close()
        self._forget_acknowledged()
        self.collector.remove()
        self.status.state.store.close()
        self.reader.store.close()
        self.state.close()
