"""Announcements of plans no index here follows, written column-wise: one sample record, the ids put in by SQL."""

from __future__ import annotations

import re
import uuid
from datetime import datetime

import orjson
import pyarrow as pa

from schemas.outbound import RECORD_OVERHEAD_BYTES
from state.invalidations import Invalidation
from state.outbox import Outbox
from state.store import Store

_PAIRS = "_orphan_pairs"
_ESCAPED = 6  # a character JSON-escaped as \u00XX takes six bytes


def holes() -> tuple[str, str]:
    """A plan id and plan key for the sample announcement, which no real id or key can equal (random, NUL first)."""
    return f"\x00{uuid.uuid4().hex}", f"\x00{uuid.uuid4().hex}"


def announce(store: Store, outbox: Outbox, pairs: list[tuple[str, str]], sample: Invalidation, topic: str,
             at: datetime | None) -> None:
    """Queue `sample` for each (plan key, plan id) of `pairs` with their id and key in place of its holes; mark the
    plans invalidated with history, as `PlanWriter.announce` and `PlanStore.invalidate_many` would, row by row.

    `sample` is the announcement of the holes `holes()` gave; its cause may name the plan as
    `plan:<id>` (a plan no applied event explains is its own record's cause). A 20,000-plan
    restart announced every head it no longer follows through Python objects in 1.5-2 s.
    """
    if not pairs:
        return
    if sample.full_cause is not None:
        raise ValueError("a redacted announcement carries an audit receipt of its own: not a sample")
    plan_hole, key_hole = sample.plan_id, sample.plan_key
    if not all(re.fullmatch("\x00[0-9a-f]{32}", hole) for hole in (plan_hole, key_hole)):
        raise ValueError("the sample's plan id and key are not holes from `holes()`")  # they go into SQL as text
    record, cause = orjson.dumps(sample.record()).decode(), orjson.dumps(sample.cause).decode()
    # Longest first: the quoted `plan:<hole>` holds the plan hole, but not its quoted form.
    fills = [(_json(f"plan:{plan_hole}"), "to_json('plan:' || plan_id)::VARCHAR"),
             (_json(plan_hole), "to_json(plan_id)::VARCHAR"), (_json(key_hole), "to_json(plan_key)::VARCHAR")]
    for text, allowed in ((record, fills), (cause, fills[:1])):
        rest = text
        for hole, _ in allowed:
            if rest.count(hole) > 1:  # a successor or another field would be given the plan's own id
                raise ValueError("the sample names its plan where only its id, key and event id can be filled in")
            rest = rest.replace(hole, "")
        if plan_hole[1:] in rest or key_hole[1:] in rest:
            raise ValueError("the sample names its plan where only its id, key and event id can be filled in")
    db = store.db
    db.register(_PAIRS, pa.table({"pos": pa.array(range(len(pairs)), pa.int64()),
                                  "plan_key": pa.array([k for k, _ in pairs], pa.string()),
                                  "plan_id": pa.array([i for _, i in pairs], pa.string())}))
    try:
        value = _filled("?", fills)
        longest_id = max(len(i.encode()) for _, i in pairs)
        longest_key = max(len(k.encode()) for k, _ in pairs)
        # The record's key, then its value with each hole filled (every byte escaped, at worst).
        largest = longest_id + len(record.encode()) + _ESCAPED * (2 * longest_id + len("plan:") + longest_key) \
            + 3 * 2 + RECORD_OVERHEAD_BYTES
        outbox.add_selected(f"SELECT ? AS topic, encode(plan_id) AS key, encode({value}) AS value, NULL::VARCHAR, "
                            f"NULL::INTEGER, NULL::BIGINT FROM {_PAIRS} ORDER BY pos", [topic, record], False, largest)
        reason = sample.reason
        history_cause = _filled("?", [(fills[0][0], fills[0][1].replace("plan_id", "o.plan_id"))])
        db.execute("INSERT INTO plan_history (plan_id, reason, cause, successor_plan_id, invalidated_at) "
                   f"SELECT plan_id, ?, {history_cause}, NULL, ? FROM {_PAIRS} o ORDER BY pos", [reason, cause, at])
        store.heads.remove_plans([i for _, i in pairs])
        db.execute(f"UPDATE plans SET status = 'invalidated', reason = ?, cause = {history_cause}, "
                   f"successor_plan_id = NULL, invalidated_at = ? FROM (SELECT DISTINCT plan_id FROM {_PAIRS}) o "
                   "WHERE plans.plan_id = o.plan_id", [reason, cause, at])
        store.heads_changed()
    finally:
        db.unregister(_PAIRS)


def _json(text: str) -> str:
    return orjson.dumps(text).decode()


def _filled(template: str, fills: list[tuple[str, str]]) -> str:
    """SQL putting each fill's expression in place of its hole in the text `template` (an expression) holds."""
    for hole, expression in fills:
        template = f"replace({template}, '{hole}', {expression})"
    return template
