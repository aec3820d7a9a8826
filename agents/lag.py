"""Consumer lag from the topics' end offsets; fail closed when revocations are behind or unknown."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from compiler.errors import AttestError
from state.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RevocationStatus:
    """How fresh this worker's view of revocations is."""

    state: str
    """ok, behind or unknown."""
    lag_events: int | None
    """Revocations published but not yet applied (None when unknown)."""
    seconds_behind: float | None
    """How long the worker has not been caught up (None when unknown)."""
    bound_seconds: float
    """The configured bound beyond which plans are not served."""

    def as_dict(self) -> dict:
        """Shape shown in /healthz and in refusals."""
        return {"state": self.state, "lag_events": self.lag_events,
                "seconds_behind": None if self.seconds_behind is None else round(self.seconds_behind, 3),
                "bound_seconds": self.bound_seconds}


class LagWatcher:
    """Polls the input topics' end offsets and compares them with what the store applied."""

    def __init__(self, store: Store, bootstrap_servers: str, topics: dict[str, str], bound_seconds: float,
                 poll_interval: float = 0.5, kafka: dict | None = None) -> None:
        self.store = store
        self.bootstrap_servers = bootstrap_servers
        self.topics = topics  # logical name -> broker-side name
        self.ends: dict[str, dict[int, int]] = {}
        self.bound = bound_seconds
        self.poll_interval = poll_interval
        self._consumer: AIOKafkaConsumer | None = None
        self._checked_at: float | None = None
        self._caught_up_at: float | None = None
        self._started_at = time.monotonic()
        self._lag: int | None = None
        self.kafka = kafka or {}  # KafkaSecurity.client_kwargs()

    async def refresh(self) -> None:
        """Learn each input partition's end from a separate consumer, so a paused agent cannot hide its lag.

        The end is the larger of ListOffsets and the high watermark of a small fetch from the
        applied position: the embedded Tansu broker answers ListOffsets with the number of
        batches rather than records (seen with Tansu 0.6.0), which alone would under-report lag.
        """
        try:
            consumer = await self._ensure_consumer()
            applied = self.store.next_offsets()
            tps = sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
            logical = {v: k for k, v in self.topics.items()}
            for tp in tps:
                consumer.seek(tp, applied.get(logical[tp.topic], {}).get(tp.partition, 0))
            await consumer.getmany(timeout_ms=150, max_records=1)
            listed = await consumer.end_offsets(tps)
        except Exception as exc:  # noqa: BLE001 - any failure leaves the state unknown, i.e. closed
            log.warning("revocation lag unknown: %s", exc)
            self._checked_at = None
            return
        self.ends = {}
        for tp in tps:
            end = max(listed.get(tp, 0), consumer.highwater(tp) or 0)
            self.ends.setdefault(logical[tp.topic], {})[tp.partition] = end
        revoked = applied.get("revocations", {})
        self._lag = sum(max(0, end - revoked.get(p, 0)) for p, end in self.ends.get("revocations", {}).items())
        now = time.monotonic()
        self._checked_at = now
        if self._lag == 0:
            self._caught_up_at = now

    async def _ensure_consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
                                        request_timeout_ms=5000, fetch_max_wait_ms=50,
                                        max_partition_fetch_bytes=4096, **self.kafka)
            await consumer.start()
            self._consumer = consumer
        tps = []
        for name in self.topics.values():
            partitions = self._consumer.partitions_for_topic(name)
            if not partitions:
                await self._consumer.topics()  # refresh metadata
                partitions = self._consumer.partitions_for_topic(name) or set()
            tps.extend(TopicPartition(name, p) for p in partitions)
        if set(tps) != self._consumer.assignment():
            self._consumer.assign(tps)
        return self._consumer

    def lags(self) -> dict[str, dict[int, int]]:
        """Unapplied events per input topic and partition, as of the last poll."""
        applied = self.store.next_offsets()
        return {t: {p: max(0, end - applied.get(t, {}).get(p, 0)) for p, end in parts.items()}
                for t, parts in self.ends.items()}

    def status(self) -> RevocationStatus:
        """ok only when recently checked and not behind by more than the bound."""
        now = time.monotonic()
        if self._checked_at is None or now - self._checked_at > max(3 * self.poll_interval, 2.0):
            return RevocationStatus("unknown", None, None, self.bound)
        # Re-count against what the store has applied by now: an agent that caught up since the
        # last poll is not behind on anything this worker knows of.
        applied = self.store.next_offsets().get("revocations", {})
        lag = sum(max(0, end - applied.get(p, 0)) for p, end in self.ends.get("revocations", {}).items())
        if lag == 0:
            self._caught_up_at = now
        behind = 0.0 if lag == 0 else now - (self._caught_up_at or self._started_at)
        return RevocationStatus("ok" if behind <= self.bound else "behind", lag, behind, self.bound)

    def check(self) -> RevocationStatus:
        """Raise a 503 AttestError unless revocations are known and within the bound."""
        status = self.status()
        if status.state == "unknown":
            raise AttestError("revocations_unknown", "This worker cannot tell whether it has applied every "
                              "revocation (starting, rebalancing or the broker is unreachable), so it will "
                              "not serve a plan that could carry a revoked permit; retry shortly.", status=503)
        if status.state == "behind":
            raise AttestError("revocations_behind", f"This worker is {status.seconds_behind:.1f}s behind on "
                              f"revocations ({status.lag_events} unapplied, bound {status.bound_seconds}s), so "
                              "it will not serve a plan that could carry a revoked permit; retry shortly.",
                              status=503)
        return status

    async def stop(self) -> None:
        """Close the watermark consumer."""
        if self._consumer is not None:
            await self._consumer.stop()
