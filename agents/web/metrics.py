"""Prometheus metrics of one worker: lag, latency, plans, index, compilations, dead letters, refusals."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from state.file_size import file_size

if TYPE_CHECKING:
    from agents.ops.chores import Chores
    from agents.ops.collector import Collector
    from agents.stream.lag import LagWatcher
    from agents.ops.loop_probe import LoopProbe
    from agents.web.query import QueryService
    from state.local_state import LocalState

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# The apply path's stages take a few to a few tens of milliseconds: finer buckets there.
STAGE_BUCKETS = (0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
                 2.5, 5.0, 10.0, 30.0)
# How late the loop probe woke (agents.ops.loop_probe): most samples are well under a millisecond.
STALL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Observations:
    """The worker's histograms, made before what they observe so that each is handed its callback when built."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.event_to_invalidation = Histogram(
            "freshplan_event_to_invalidation_seconds", "Broker timestamp of an input event to its invalidation",
            buckets=LATENCY_BUCKETS, registry=self.registry)
        self.compile_seconds = Histogram(
            "freshplan_compile_seconds", "Time to compile one plan", ["path"], buckets=LATENCY_BUCKETS,
            registry=self.registry)
        self.batch_wait = Histogram(
            "freshplan_batch_wait_seconds", "Broker timestamp of the oldest event of an applied batch to the "
            "batch's start on the writer (waiting for the fetch and the batch before)", buckets=STAGE_BUCKETS,
            registry=self.registry)
        self.batch_apply = Histogram(
            "freshplan_batch_apply_seconds", "One batch of input events applied, its plans recompiled and "
            "committed, as the replica awaited it on the writer", buckets=STAGE_BUCKETS, registry=self.registry)
        self.loop_stall = Histogram(
            "freshplan_loop_stall_seconds", "How late the HTTP event loop's probe woke, every 10 ms: time the loop "
            "was kept from serving by work on it, the GIL held elsewhere or a collection (budget 20 ms)",
            buckets=STALL_BUCKETS, registry=self.registry)
        self.recompiled = self.compile_seconds.labels("recompile").observe
        """Seconds per recompilation (the plan writer's)."""
        self.selected = self.compile_seconds.labels("select").observe
        """Seconds per compilation on the read path."""

    def observe_batch(self, waited: float | None, took: float) -> None:
        """One applied batch: how long its oldest event waited for it (None: no broker timestamps), how long it took."""
        if waited is not None:
            self.batch_wait.observe(waited)
        self.batch_apply.observe(took)

    def observe_loop(self, stall: float) -> None:
        """One probe sample: how late the loop woke, in seconds."""
        self.loop_stall.observe(stall)


class Metrics:
    """A registry per worker (injected, not the process-global one) plus a collector over local state."""

    def __init__(self, state: "LocalState", query: "QueryService", lag: "LagWatcher",
                 probe: "LoopProbe | None" = None, collector: "Collector | None" = None,
                 chores: "Chores | None" = None, observed: Observations | None = None) -> None:
        self.observed = observed or Observations()
        self.registry = self.observed.registry
        self._state = _StateCollector(state, query, lag, probe, collector, chores)
        self.registry.register(self._state)

    def render(self, figures: dict[str, Any] | None = None) -> bytes:
        """The exposition text, with the file's figures read by the caller (`file_figures`; None: read them here)."""
        self._state.figures = figures
        try:
            return generate_latest(self.registry)
        finally:
            self._state.figures = None


def file_figures(state: "LocalState") -> dict[str, Any]:
    """What a scrape reads from the state file (through `state`'s own cursor, on any one thread)."""
    return {"counters": dict(state.store.counters()), "plans": state.plans.counts(), "index_edges": state.index.size(),
            "outbox": state.outbox.size(), "standby_outbox": state.outbox.standby_size(),
            "recompile_queue": state.queue.size(), "state_file": file_size(state.store.db)}


class _StateCollector:
    """Reads counters and sizes from DuckDB and the lag watcher at scrape time."""

    def __init__(self, state: "LocalState", query: "QueryService", lag: "LagWatcher",
                 probe: "LoopProbe | None", collector: "Collector | None", chores: "Chores | None" = None) -> None:
        self.state, self.query, self.lag, self.probe, self.gc = state, query, lag, probe, collector
        self.chores = chores
        self.figures: dict[str, Any] | None = None  # the file's figures for the scrape in progress (`file_figures`)

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        figures = self.figures if self.figures is not None else file_figures(self.state)
        counters = figures["counters"]
        lag = GaugeMetricFamily("freshplan_consumer_lag_events", "Input events published but not yet applied",
                                labels=["topic", "partition"])
        for topic, parts in sorted(self.lag.lags().items()):
            for partition, value in sorted(parts.items()):
                lag.add_metric([topic, str(partition)], value)
        yield lag
        status = self.lag.status()
        behind = -1 if status.seconds_behind is None else status.seconds_behind
        yield GaugeMetricFamily("freshplan_revocation_lag_seconds",
                                "Seconds this worker is behind on revocations (-1 when unknown)", value=behind)
        plans = GaugeMetricFamily("freshplan_plans", "Stored plans by status", labels=["status"])
        for status_name, count in sorted(figures["plans"].items()):
            plans.add_metric([status_name], count)
        yield plans
        yield GaugeMetricFamily("freshplan_index_edges", "Dependency index edges", value=figures["index_edges"])
        yield GaugeMetricFamily("freshplan_outbox_records", "Records waiting to be published", value=figures["outbox"])
        yield GaugeMetricFamily("freshplan_outbox_standby_records",
                                "Records held until the owner of their input partition publishes them",
                                value=figures["standby_outbox"])
        if self.probe is not None:
            yield GaugeMetricFamily("freshplan_loop_stall_max_seconds", "Longest time the HTTP event loop was kept "
                                    "from running since start", value=self.probe.max_stall)
        if self.gc is not None:
            pauses = GaugeMetricFamily("freshplan_gc_pause_max_seconds", "Longest garbage collection pause since "
                                       "start (it holds every thread, the HTTP loop included)", labels=["generation"])
            for generation, pause in enumerate(self.gc.pause_max):
                pauses.add_metric([str(generation)], pause)
            yield pauses
        if self.chores is not None:
            failed = CounterMetricFamily("freshplan_background_job_failures", "Failures of a timer or background "
                                         "loop (each logged and retried after a backoff)", labels=["job"])
            for job, n in sorted(self.chores.failures.items()):
                failed.add_metric([job], n)
            yield failed
        yield from _shard_families(figures.get("shard") or {})
        yield GaugeMetricFamily("freshplan_recompile_queue", "Announced plans whose successors are not compiled yet",
                                value=figures["recompile_queue"])
        state_file = figures.get("state_file") or {}
        if state_file:
            yield GaugeMetricFamily("freshplan_state_file_bytes", "Size of the DuckDB state file (its blocks)",
                                    value=state_file["bytes"])
            yield GaugeMetricFamily("freshplan_state_file_free_bytes", "Bytes of the state file in free blocks "
                                    "(dropped or compacted tables), reused for new data",
                                    value=state_file["free_bytes"])
        for name, help_text in (("invalidations", "Invalidations announced"),
                                ("unchanged_recompilations", "Recompilations that came out identical"),
                                ("compilations", "Plans compiled by agents"),
                                ("deferred_recompilations", "Plans announced before their successor was compiled"),
                                ("announced_unchanged", "Announced plans whose successor came out identical"),
                                ("plans_taken_over", "Plans of gained partitions made current here without compiling"),
                                ("plans_stale_on_take_over", "Plans of gained partitions announced stale on take-over"),
                                ("plans_handed_back", "Plans no longer indexed here because their partition moved"),
                                ("duplicate_events", "Events ignored as duplicates by event_id"),
                                ("ignored_old_versions", "Events ignored as older versions"),
                                ("plans_evicted", "Plans evicted after going unselected for the retention span"),
                                ("plan_rows_expired", "Rows of invalidated or evicted plans deleted by retention"),
                                ("receipts_expired", "Receipts deleted from local state after their retention span"),
                                ("event_ids_expired", "Event ids forgotten after the event-id retention"),
                                ("event_id_generations_dropped", "Event-id generation tables dropped by retention"),
                                ("resources_of_other_shards", "Resource changes left to the owner of their entity's "
                                 "partition"),
                                ("shards_restored", "Entity partitions restored from source-changes"),
                                ("shard_resources_restored", "Resource changes applied while restoring a shard"),
                                ("shard_resources_dropped", "Resources removed with an entity partition handed on")):
            yield CounterMetricFamily(f"freshplan_{name}", help_text, value=counters.get(name, 0))
        yield from _labelled(counters, {
            "applied.": CounterMetricFamily("freshplan_events_applied", "Input events applied", labels=["topic"]),
            "dead_letters.": CounterMetricFamily("freshplan_dead_letters", "Input events dead-lettered",
                                                 labels=["reason"]),
            "cdc_skipped.": CounterMetricFamily("freshplan_cdc_skipped", "Debezium heartbeats and transaction "
                                                "boundaries read and skipped", labels=["kind"])})
        yield from _labelled(self.query.selects, {
            "selects.": CounterMetricFamily("freshplan_selects", "Selects answered", labels=["served_from"]),
            "refused.": CounterMetricFamily("freshplan_stale_serve_refusals",
                                            "Selects refused rather than risk a stale serve", labels=["reason"])})


def _shard_families(shard: dict[str, Any]) -> Iterator:
    """The worker's shard per entity partition (the /healthz `shard` section), as gauges."""
    resources = GaugeMetricFamily("freshplan_shard_resources", "Resources held per entity partition of this "
                                  "worker's shard", labels=["partition"])
    held = GaugeMetricFamily("freshplan_shard_partitions", "Entity partitions this worker holds (1) or is "
                             "restoring (0)", labels=["partition"])
    for partition, count in sorted((shard.get("by_partition") or {}).items(), key=lambda kv: int(kv[0])):
        resources.add_metric([str(partition)], count)
        held.add_metric([str(partition)], 1)
    for partition in shard.get("restoring") or ():
        held.add_metric([str(partition)], 0)
    yield resources
    yield held
    yield GaugeMetricFamily("freshplan_shard_plans", "Plans this worker owns (heads of its plan partitions)",
                            value=shard.get("plans") or 0)
    yield GaugeMetricFamily("freshplan_shard_entities", "Entities the resources of this worker's shard are about",
                            value=shard.get("entities") or 0)


def _labelled(counts, families: dict) -> Iterator:
    """Split `prefix.label` counters into one labelled family per prefix."""
    for name, value in sorted(counts.items()):
        for prefix, family in families.items():
            if name.startswith(prefix):
                family.add_metric([name[len(prefix):]], value)
    yield from families.values()
