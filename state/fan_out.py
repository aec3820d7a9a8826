"""A fan-out beyond the eager limit, written column-wise: every plan's announcement, history and queue entry in SQL.

The plans of one fan-out share their announcement but for plan id and plan key (same event,
dependency key and stamps), so Python builds one `Template` per group of them and DuckDB fills
in the ids: a handful of statements, whatever the number of plans. It writes the tables that
`Outbox`, `PlanStore.invalidate_many` and `RecompileQueue.add_many` write, with the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import duckdb
import pyarrow as pa

from schemas.outbound import RECORD_OVERHEAD_BYTES
from state.invalidations import RECEIPT_HEX, RECEIPT_PREFIX, Template
from state.outbox import Outbox
from state.store import Store

_TOUCHED = "_fanout_touched"
_HEADS = "_fanout_heads"
_GROUPS = "_fanout_groups"
_ESCAPED = 6  # a character JSON-escaped as \u00XX takes six bytes
DROPPED_ONE_BY_ONE = 5_000  # a fan-out over more plans drops every held head, faster than finding its own


@dataclass(frozen=True, slots=True)
class Group:
    """Touched plans, not yet announced, that share everything their announcement says but plan id and key."""

    dep_key: str
    """The dependency key that touched them."""
    cause: int
    """Which of the caller's causes (events) touched them."""
    decision_type: str | None
    """For a `time:` key, their requests' decision type (another policy version may have taken over)."""
    redact: bool
    """Touched through a resource their principal may not learn of: the public cause withholds it."""
    plans: int
    """How many plans."""


@dataclass(frozen=True, slots=True)
class Announcement:
    """What a group of plans is told: the caller's decision for one `Group`."""

    group: Group
    """The plans."""
    reason: str
    """The invalidation reason."""
    cause: str
    """The public cause as JSON text, as `PlanStore.invalidate_many` stores it."""
    template: Template
    """The records around each plan's id and key."""
    source: tuple[str, int, int]
    """(input topic, partition, offset) of the event: the outbox and queue tag records with it."""


class FanOut:
    """One fan-out inside the caller's transaction: `stage`, then `write`, and always `drop`."""

    def __init__(self, store: Store, outbox: Outbox) -> None:
        self.store = store
        self.db = store.db
        self.outbox = outbox

    def stage(self, plan_keys: list[str], dep_keys: list[str], causes: list[int]) -> tuple[int, list[Group]]:
        """Join touched plan keys with their heads: (heads found, groups of the plans not announced yet).

        A plan already invalidated (announced and waiting in the queue) counts as a head but is
        in no group, as in the eager path.
        """
        kinds = {key.partition(":")[0] for key in set(dep_keys)}
        decision = ("CASE WHEN starts_with(t.dep_key, 'time:') THEN json_extract_string(p.request, '$.decision_type') "
                    "END" if "time" in kinds else "NULL::VARCHAR")
        # What a plan admitted or rejected by name, its principal may learn of (`PlanStore.discoverable`).
        redact = ("CASE WHEN starts_with(t.dep_key, 'resource:') THEN NOT coalesce(list_contains(list_concat("
                  "json_extract_string(p.plan, '$.admitted[*].resource_id'), "
                  "json_extract_string(p.plan, '$.rejected[*].resource_id')), substr(t.dep_key, 10)), false) "
                  "ELSE false END" if "resource" in kinds else "false")
        self.db.register(_TOUCHED, pa.table({"plan_key": pa.array(plan_keys, pa.string()),
                                             "dep_key": pa.array(dep_keys, pa.string()),
                                             "cause": pa.array(causes, pa.int32())}))
        self.db.execute(f"CREATE OR REPLACE TEMP TABLE {_HEADS} AS SELECT t.plan_key, h.plan_id, t.dep_key, t.cause, "
                        f"{decision} AS decision_type, {redact} AS redact, "
                        "p.status IS NOT DISTINCT FROM 'invalidated' AS announced "
                        f"FROM {_TOUCHED} t JOIN plan_heads h USING (plan_key) JOIN plans p USING (plan_id)")
        heads = self.db.execute(f"SELECT count(*) FROM {_HEADS}").fetchone()[0]
        rows = self.db.execute(f"SELECT dep_key, cause, decision_type, redact, count(*) FROM {_HEADS} "
                               "WHERE NOT announced GROUP BY ALL ORDER BY ALL").fetchall()
        return heads, [Group(*row) for row in rows]

    def write(self, announced: list[Announcement], invalidations_topic: str, receipts_topic: str, standby: bool,
              at: datetime | None) -> None:
        """Queue every staged plan's records, mark the plans invalidated with history, queue their plan keys."""
        if not announced:
            return
        self.db.register(_GROUPS, pa.table({
            "dep_key": [a.group.dep_key for a in announced],
            "cause": pa.array([a.group.cause for a in announced], pa.int32()),
            "decision_type": pa.array([a.group.decision_type for a in announced], pa.string()),
            "redact": pa.array([a.group.redact for a in announced], pa.bool_()),
            "reason": [a.reason for a in announced], "cause_text": [a.cause for a in announced],
            "rec_head": [a.template.record[0] for a in announced],
            "rec_mid": [a.template.record[1] for a in announced],
            "rec_tail": [a.template.record[2] for a in announced],
            "audit_head": pa.array([a.template.audit and a.template.audit[0] for a in announced], pa.string()),
            "audit_tail": pa.array([a.template.audit and a.template.audit[1] for a in announced], pa.string()),
            "src_topic": [a.source[0] for a in announced],
            "src_partition": pa.array([a.source[1] for a in announced], pa.int32()),
            "src_offset": pa.array([a.source[2] for a in announced], pa.int64())}))
        plans = (f"{_HEADS} f JOIN {_GROUPS} g ON f.dep_key = g.dep_key AND f.cause = g.cause "
                 "AND f.decision_type IS NOT DISTINCT FROM g.decision_type AND f.redact = g.redact "
                 "WHERE NOT f.announced")
        body = "g.audit_head || to_json(f.plan_id)::VARCHAR || g.audit_tail"
        # Order within one fan-out is free: each plan is announced once, and a receipt goes to another topic.
        rows = (f"SELECT ? AS topic, encode(f.plan_id) AS key, encode(g.rec_head || to_json(f.plan_id)::VARCHAR || "
                f"g.rec_mid || to_json(f.plan_key)::VARCHAR || g.rec_tail) AS value, g.src_topic, g.src_partition, "
                f"g.src_offset FROM {plans} "
                "UNION ALL "
                "SELECT ?, encode(rid), encode(left(body, -1) || ',\"receipt_id\":\"' || rid || '\"}'), src_topic, "
                f"src_partition, src_offset FROM (SELECT {body} AS body, '{RECEIPT_PREFIX}' || "
                f"left(sha256({body}), {RECEIPT_HEX}) AS rid, g.src_topic, g.src_partition, g.src_offset FROM {plans} "
                "AND g.audit_head IS NOT NULL)")
        self.outbox.add_selected(rows, [invalidations_topic, receipts_topic], standby, self._largest(announced))
        self.db.execute("INSERT INTO plan_history (plan_id, reason, cause, successor_plan_id, invalidated_at) "
                        f"SELECT f.plan_id, g.reason, g.cause_text, NULL, ? FROM {plans}", [at])
        if sum(a.group.plans for a in announced) <= DROPPED_ONE_BY_ONE:
            # Other plans' heads stay held: their cached selects are still answered from memory.
            self.store.heads.remove_keys(key for key, in self.db.execute(f"SELECT f.plan_key FROM {plans}").fetchall())
        else:  # thousands of heads: held ones all go (a miss reads the file)
            self.store.heads.remove_all()
        self.db.execute("UPDATE plans SET status = 'invalidated', reason = x.reason, cause = x.cause_text, "
                        "successor_plan_id = NULL, invalidated_at = ? "
                        f"FROM (SELECT f.plan_id, g.reason, g.cause_text FROM {plans}) x "
                        "WHERE plans.plan_id = x.plan_id", [at])
        self.db.execute(f"INSERT INTO recompile_queue (plan_key) SELECT DISTINCT f.plan_key FROM {plans} "
                        "AND f.plan_key NOT IN (SELECT plan_key FROM recompile_queue)")  # see RecompileQueue.add_many
        self.store.heads_changed()

    def _largest(self, announced: list[Announcement]) -> int:
        """An upper bound on the framed size of any record `write` queues (ids escaped at worst)."""
        longest_id, longest_key = self.db.execute(
            f"SELECT coalesce(max(strlen(plan_id)), 0), coalesce(max(strlen(plan_key)), 0) "
            f"FROM {_HEADS}").fetchone()
        ids, keys = _ESCAPED * longest_id + 2, _ESCAPED * longest_key + 2  # JSON strings, quoted
        record = longest_id + max(len("".join(a.template.record).encode()) for a in announced) + ids + keys
        audit = max((len("".join(a.template.audit).encode()) for a in announced if a.template.audit), default=0)
        receipt_id = len(RECEIPT_PREFIX) + RECEIPT_HEX
        receipt = receipt_id + audit + ids + len(',"receipt_id":""') + receipt_id if audit else 0
        return max(record, receipt) + RECORD_OVERHEAD_BYTES

    def drop(self) -> None:
        """Forget the staged tables (whether or not `write` ran)."""
        for name in (_TOUCHED, _GROUPS):
            self.db.unregister(name)  # a name never registered is no error
        try:
            self.db.execute(f"DROP TABLE IF EXISTS {_HEADS}")
        except duckdb.Error:  # the transaction failed: its rollback drops the table, and the caller sees why
            pass
