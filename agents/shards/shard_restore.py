"""A worker's entity shard follows the group's assignment: drop what it lost, restore what it gained from its lane."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Callable, Collection

from agents.stream.event_apply import OVERSIZED, EventApplier
from agents.stream.lane_events import by_position, event_ids, moves_to_apply
from agents.stream.raw_message import RawMessage
from schemas.codec import decode
from schemas.errors import InvalidEvent, SkippedEvent
from schemas.records import InputEvent, SourceChange
from schemas.routed_batch import SHARED
from schemas.shard_peek import peek
from state.catalog_resources import apply_resources, drop_resources, held_entities
from state.catalog_resources import refused as refused_by_source
from state.shard_state import ShardState

log = logging.getLogger(__name__)


class Shards:
    """The resources a worker holds follow the plan partitions it owns (see `ShardState`).

    A gained partition is restored from its lane (`entity-changes`), read from its start by the
    replica beside the live lanes: the lane's records below what the worker applied are its
    history, restored here; the rest joins the merge. Once the lane has caught up with every
    source partition the shard is held (in the file) and its plans can be taken over.
    """

    def __init__(self, state: ShardState, applier: EventApplier, standby_replicas: int = 0,
                 reading: Callable[[], frozenset[int]] | None = None) -> None:
        self.state = state
        self.reading = reading  # the lanes the replica reads now (`LaneReader.read_now`); None: every gained one
        self.incomplete: frozenset[int] = frozenset()  # restored partitions whose history the lanes no longer had
        self.standby_replicas = standby_replicas  # warm copies: the next partitions after each owned one
        self.applier = applier
        self.last_restore: dict | None = None  # partitions, records read, rows restored, seconds: for /healthz
        self.read_ahead = {"times": 0, "partitions": [], "failures": 0}  # rebalances' read-aheads, for /healthz
        self._restoring: dict[int, list] = {}  # lane -> [started, history records read, resource changes applied]
        self.assigned: frozenset[int] = frozenset()
        """The entity partitions the group last gave this worker: a lane among them is restored as its owner."""
        self.suspected: frozenset[int] = frozenset()
        """Partitions of a peer that refuses connections (`PeerWatch`): kept as extra copies until it is settled."""
        self.starting: frozenset[int] = frozenset()
        """Lanes the follower started reading from their start that the writer has not seen caught up yet."""
        self._refused: dict[int, list[tuple[RawMessage, str, str]]] = {}  # lane -> refusals in its history

    @property
    def standby(self) -> frozenset[int]:
        """Held partitions that are not owned: warm copies restored ahead of a take-over."""
        return self.state.copies

    @standby.setter
    def standby(self, partitions: frozenset[int]) -> None:
        self.state.copies = frozenset(partitions)

    def standby_for(self, owned: frozenset[int]) -> frozenset[int]:
        """The partitions to keep warm copies of: the `standby_replicas` next ones after each owned partition, and
        those of a peer that seems dead (`suspected`).

        With partitions spread evenly over the group, the next partitions are mostly another
        worker's: when that worker dies, its partitions are already here and need no restore.
        """
        total = self.state.partitions
        copies = range(1, min(self.standby_replicas, total - 1) + 1)
        return (frozenset((p + k) % total for p in owned for k in copies) | self.suspected) - owned

    def settled(self) -> None:
        """The move's transaction has ended: no partition is being restored any more."""
        self.state.moves += 1  # first: a reader that then sees `restoring` cleared sees the move ended too
        self.state.restoring = self.state.catching  # lanes still being read from their start

    def reload(self) -> None:
        """After a rolled-back move: the held partitions as the file has them."""
        self.state.reload()
        self.standby = self.standby & self.state.held

    def refusing(self) -> frozenset[int]:
        """Partitions given to this worker whose shard it is restoring: their selects are refused, not forwarded."""
        return (self.state.restoring | self.starting) & self.assigned

    def ahead(self, owned: frozenset[int]) -> frozenset[int]:
        """The partitions to read ahead while the group rebalances: those one standby copy would hold (the next
        after each owned partition), so that a dead neighbour's shard is restored before the assignment names it."""
        total = self.state.partitions
        return frozenset((p + 1) % total for p in owned) - owned if total > 1 else frozenset()

    def wanted(self, owned: frozenset[int]) -> frozenset[int]:
        """The partitions to hold for these owned ones: them and their standby copies."""
        return owned | self.standby_for(owned)

    def move(self, assigned: Collection[int]) -> None:
        """Hold the assigned partitions and their standby copies (on the writer, inside the caller's transaction).

        Gained partitions must have been restored from their lanes first (`Replica.gain_lanes`).
        """
        owned = frozenset(assigned)
        standby = self.standby_for(owned)
        after = owned | standby
        lost, gained = self.state.held - after, after - self.state.held
        if gained:
            raise RuntimeError(f"entity partitions {sorted(gained)} are not restored yet: their lanes are still "
                               "being read")
        outbox = self.applier.state.outbox
        # Judged by the rows, not by what was a copy before (not in the file): what was kept for a lane's owner
        # and no report of it covered goes out where the lane is owned now, and is forgotten where it is not held.
        promoted = outbox.promote_lanes(owned)
        if promoted:
            log.info("sent %d dead letters of entity partitions %s that their previous owner left unreported",
                     promoted, sorted(owned), extra={"reason": "lane_letters_promoted"})
        outbox.drop_lanes(after)
        self.standby = standby
        self.incomplete = self.incomplete & after
        if lost:
            dropped = self.state.drop(lost)
            log.info("handed entity partitions %s to their new owner: %d resources removed", sorted(lost), dropped,
                     extra={"partitions": sorted(lost), "reason": "shard_dropped"})

    def gain(self, lanes: frozenset[int]) -> None:
        """A clean slate for lanes read from their start (on the writer): rows left about their entities
        are tombstones of resources that moved there while another worker held them; the lane decides again."""
        store = self.applier.state.store
        partition_of = self.state.partition_of
        with store.transaction():
            drop_resources(store, [e for e in held_entities(store) if partition_of(e) in lanes])
            store.forget_offsets("entity-changes", sorted(lanes))
        self.state.catching = self.state.catching | lanes
        self.state.restoring = self.state.restoring | lanes
        if store.incarnation()[1] > 0:
            # As a fresh worker reading the lanes would: what a broker reset took with the old topics is gone.
            self.incomplete = self.incomplete | lanes
            with store.transaction():
                store.bump_many({"shard_restores_incomplete": 1})
            log.warning("restoring entity partitions %s: the input topics were reset and rebased, and the old "
                        "lanes' records are gone; resources changed only there are missing from this shard until "
                        "their sources publish them again (a CDC re-snapshot)", sorted(lanes),
                        extra={"partitions": sorted(lanes), "reason": "shard_incomplete"})
        for q in lanes:
            self._restoring[q] = [time.perf_counter(), 0, 0]
            self._refused.pop(q, None)
        log.info("restoring entity partitions %s from their lanes", sorted(lanes),
                 extra={"partitions": sorted(lanes), "reason": "shard_restoring"})

    def lose(self, lanes: frozenset[int]) -> None:
        """Lanes no longer read (on the writer): a shard caught up is dropped by the next move; one still
        catching up is dropped here."""
        self.starting = self.starting - lanes
        for q in lanes - self.state.catching:
            self._refused.pop(q, None)  # refusals of a read that ended before the writer saw it start
        catching = lanes & self.state.catching
        if not catching:
            return
        store = self.applier.state.store
        partition_of = self.state.partition_of
        with store.transaction():
            drop_resources(store, [e for e in held_entities(store) if partition_of(e) in catching])
            self.applier.state.outbox.drop_lanes(self.state.held | (self.state.catching - catching))
        self.state.catching = self.state.catching - catching
        self.state.restoring = self.state.restoring - catching
        self.incomplete = self.incomplete - catching
        for q in catching:
            self._restoring.pop(q, None)
            self._refused.pop(q, None)

    def restore(self, history: list[RawMessage]) -> int:
        """Apply lane history (records below what the worker applied) of the lanes catching up; rows changed.

        Offsets, the event-id ledger and plans are left alone (the take-over judges parked plans by
        the key changes recorded here). A refusal was dead-lettered by whoever owned the lane then,
        unless no report of that owner covers it (it may have died first): those of a lane gained as
        its owner are kept, and dead-lettered once the lane caught up (`caught_up`), at least once.
        """
        catching = self.state.catching
        if not history or not catching:
            return 0
        partition_of = self.state.partition_of

        def mine(entity: str | None) -> bool:
            return entity is not None and partition_of(entity) in catching

        applier = self.applier
        decoded: list[tuple[RawMessage, InputEvent | None]] = []
        refused: list[tuple[RawMessage, str, str]] = []  # dead-lettered once the lane caught up, if unreported
        for m in history:
            entry = self._restoring.get(m.lane)  # type: ignore[arg-type]
            if entry is not None:
                entry[1] += 1
            if m.original_size is not None:
                refused.append((m, "oversized", OVERSIZED))
                continue
            if m.notice:
                decoded.append((m, None))  # most name resources the lane never had: see `moves_to_apply`
                continue
            glance = peek(m.value)  # a lane holds its own entities' resources, and unknown deletes
            if glance is not None and (glance.kind != "resource" or (glance.entity is not None
                                                                     and not mine(glance.entity))):
                continue
            try:
                decoded.append((m, decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}",
                                          max_bytes=applier.max_event_bytes, cdc=applier.cdc)))
            except SkippedEvent:
                continue
            except InvalidEvent as exc:
                refused.append((m, exc.error_class, exc.message))
        changes = [(m, event.payload, event.event_id)
                   for m, event in moves_to_apply(decoded, applier.now, applier.state.catalog.live_resources)
                   if isinstance(event.payload, SourceChange) and event.payload.kind == "resource"]
        if not changes and not refused:
            return 0
        left = {j: SHARED if m.lane is None else m.lane for j, (m, _, _) in enumerate(changes) if m.notice}
        store = applier.state.store
        with store.transaction():
            # No source rules: what its holder accepted then stays (policy changes never remove stored
            # resources), and the compiler still refuses what today's bundle does not trust. Which records no
            # report covers (their holder may never have judged them) is known only once the lane caught up:
            # today's rules name their refusals for the dead letters, and only those.
            results = apply_resources(store, [c for _, c, _ in changes], {}, mine, left, self.state.lane_of)
            rules = applier.state.catalog.source_rules()
            refused += [(m, r.error_class, r.message) for (m, _, _), r in zip(changes, results, strict=True)
                        if isinstance(r, InvalidEvent)]
            refused += [(m, *_source_refusal()) for m, change, _ in changes
                        if refused_by_source(change.record, change.unavailable, rules)]
            for m, error_class, message in refused:
                self._refused.setdefault(m.lane, []).append((m, error_class, message))  # type: ignore[arg-type]
            keyed = by_position(((m.topic, m.partition, m.offset), keys)
                                for (m, _, _), keys in zip(changes, results, strict=True) if isinstance(keys, list))
            ids = event_ids(((m.topic, m.partition, m.offset), event_id)
                            for (m, _, event_id), keys in zip(changes, results, strict=True)
                            if isinstance(keys, list) and keys)
            applier.state.key_changes.record(keyed, ids)
        for q in {m.lane for m, _, _ in changes}:
            if q in self._restoring:
                self._restoring[q][2] += sum(1 for (m, _, _) in changes if m.lane == q and
                                             (m.topic, m.partition, m.offset) in keyed)
        return len(keyed)

    def caught_up(self, lanes: frozenset[int], reported: dict[int, dict[int, int]] | None = None) -> None:
        """Lanes that joined the merge in every source partition (on the writer): their shards are whole.

        The refusals their history held that no report read on the lane covers (the lane's reports follow what
        they cover: only the whole lane says which were sent) are dead-lettered now by the lane's owner; a copy
        (standby, or read ahead in a rebalance) keeps them for the owner, and sends them if it becomes the owner
        before a report covers them (`Outbox.promote_lanes`)."""
        lanes = lanes & self.state.catching
        if not lanes:
            return
        store = self.applier.state.store
        counts: Counter[str] = Counter({"shards_restored": len(lanes)})
        with store.transaction():
            self.state.add(lanes)
            # A lane the group did not give is a copy until a move says otherwise: its owner reports it.
            self.state.copies = self.state.copies | (lanes - self.assigned)
            for q in sorted(lanes):
                marks = (reported or {}).get(q, {})
                owner = q in self.assigned
                for m, error_class, message in self._refused.pop(q, []):
                    if m.offset < marks.get(m.partition, 0):
                        continue
                    if owner:
                        self.applier.dead_letter_lane_record(m, error_class, message, counts)
                    else:
                        self.applier.keep_lane_letter(m, error_class, message, counts)
            store.bump_many(counts)
        self.state.catching = self.state.catching - lanes
        self.state.restoring = self.state.restoring - lanes
        self.starting = self.starting - lanes
        self.state.moves += 1
        whole = {"partitions": sorted(lanes), "records_read": 0, "resources_restored": 0, "seconds": 0.0}
        for q in sorted(lanes):
            started, read, restored = self._restoring.pop(q, [time.perf_counter(), 0, 0])
            seconds = time.perf_counter() - started
            # Lanes caught up together are one restore: their reads were interleaved.
            whole["records_read"] += read
            whole["resources_restored"] += restored
            whole["seconds"] = max(whole["seconds"], round(seconds, 3))
            log.info("restored entity partition %d from its lane: %d records read, %d resource changes applied, "
                     "%.2fs", q, read, restored, seconds, extra={"partitions": [q], "reason": "shard_restored"})
        self.last_restore = whole

    def lanes_applied(self, batch, before: bool) -> None:
        """The replica's hook around a batch (on the writer): gained lanes and history first, caught-up lanes after."""
        if before:
            # A lane let go while the batch waited (its loss queued on the writer first) is not gained by it.
            gained = frozenset(batch.gained) & (self.reading() if self.reading is not None else batch.gained)
            if gained:
                self.gain(gained)
            self.restore(batch.history)
        else:
            self.caught_up(frozenset(batch.caught_up), batch.reported)


def _source_refusal() -> tuple[str, str]:
    """The dead letter of a history record today's source rules refuse (its holder may never have judged it)."""
    return ("class_not_allowed_for_source", "the resource's provenance_group may not assert its evidence_class "
            "(see the policy bundle's sources): no plan admits it")
