"""Outbound record builders give the wire shapes consumers already read, valid against the shipped schemas."""

from __future__ import annotations

import base64
import hashlib

import orjson

import pytest

from schemas.outbound import (Cause, clock_tick, compact_plan, input_dead_letter, invalidation_cause,
                              invalidation_receipt, invalidation_record, too_large_letter)
from tests.schema_check import validators

CHECK = validators(documented=True)
CAUSE = invalidation_cause(topic="p-source-changes", partition=1, offset=6, event_id="e-1",
                           dependency_key="resource:investigation-X9")


def test_an_invalidation_record_is_the_wire_shape():
    record = invalidation_record(plan_id="plan-1", plan_key="pk-1", reason="source_changed", cause=CAUSE,
                                 invalidated_at="2026-11-30T07:52:27.511924Z", as_of="2026-08-30T09:00:00Z",
                                 successor_plan_id="plan-2")
    assert list(record) == ["schema_version", "plan_id", "plan_key", "reason", "cause", "invalidated_at", "as_of",
                            "successor_plan_id"]
    assert list(record["cause"]) == ["topic", "partition", "offset", "event_id", "dependency_key"]
    assert CHECK["plan-invalidations"].is_valid(record)
    assert CHECK["plan-invalidations"].is_valid(dict(record, as_of=None, successor_plan_id=None, reason="evicted"))
    assert not CHECK["plan-invalidations"].is_valid(dict(record, reason="because"))


def test_a_cause_without_one_record_to_blame_has_no_position_but_the_wire_keeps_integers():
    replay = Cause("replay", "replay-1", dependency_key="replay")
    assert replay.partition is None and replay.offset is None
    wire = replay.as_wire()
    assert list(wire) == ["topic", "partition", "offset", "event_id", "dependency_key"]
    assert (wire["partition"], wire["offset"]) == (-1, -1)  # the schema wants integers there
    assert Cause.from_wire(wire) == replay and Cause.from_wire(CAUSE) == Cause("p-source-changes", "e-1", 1, 6,
                                                                               "resource:investigation-X9")
    for broken in ({}, {"topic": "t", "partition": "x", "offset": 1, "event_id": "e"}, {"topic": "t", "offset": 1}):
        with pytest.raises((KeyError, TypeError, ValueError)):
            Cause.from_wire(broken)


def test_causes_of_one_event_are_equal_whatever_their_broker_timestamps():
    # The plan writer shares one announcement's parts among the plans an event touched by the cause's value.
    first, again = Cause("source-changes", "e-1", 0, 7, at=1.0), Cause("source-changes", "e-1", 0, 7, at=2.0)
    assert first == again and hash(first) == hash(again) and first.as_wire() == again.as_wire()
    assert "at" not in first.as_wire()
    assert Cause("source-changes", "e-2", 0, 8) != first


def test_the_audit_receipt_id_is_the_hash_the_invalidator_always_gave_it():
    audit = invalidation_receipt(plan_id="plan-1", reason="source_changed", cause=CAUSE,
                                 invalidated_at="2026-11-30T07:52:27Z", successor_plan_id=None)
    # The form agents/stream/invalidation.py built by hand before the builder existed.
    by_hand = {"schema_version": 1, "kind": "invalidation", "plan_id": "plan-1", "reason": "source_changed",
               "cause": CAUSE, "invalidated_at": "2026-11-30T07:52:27Z", "successor_plan_id": None}
    expected = "rcpt-inv-" + hashlib.sha256(orjson.dumps(by_hand)).hexdigest()[:20]
    assert audit == dict(by_hand, receipt_id=expected)
    assert CHECK["receipts"].is_valid(audit)
    assert not CHECK["receipts"].is_valid({k: v for k, v in audit.items() if k != "cause"})


def test_a_wall_clock_tick_is_a_valid_clock_event():
    tick = clock_tick("2026-08-30T09:00:00Z")
    assert tick == {"event_id": "wall-2026-08-30T09:00:00Z", "schema_version": 1,
                    "occurred_at": "2026-08-30T09:00:00Z", "now": "2026-08-30T09:00:00Z"}
    assert CHECK["clock"].is_valid(tick) and not CHECK["clock"].is_valid(clock_tick("soon"))


def test_dead_letters_and_compact_plans_match_their_schemas():
    letter = orjson.loads(input_dead_letter("t-source-changes", 0, 3, "malformed_json", "not JSON", b"x" * 70_000))
    assert CHECK["dead-letters"].is_valid(letter) and letter["original_truncated"]
    assert len(base64.b64decode(letter["original"])) == 64 * 1024
    too_large = orjson.loads(too_large_letter("t-plans", b"plan-1", b"{}" * 10, 5, "stored"))
    assert CHECK["dead-letters"].is_valid(too_large) and too_large["outbound_key"] == "plan-1"
    plan = {"schema_version": 1, "plan_id": "p", "plan_key": "k", "state": "SUFFICIENT", "slots": [],
            "admitted": [{"resource_id": "r", "version": 1, "evidence_class": "c", "tokens": 3, "content": "abc"}],
            "stop_reason": "contract_satisfied", "budget_spent": {}, "valid_until": None, "receipt_id": "rc",
            "request": {"query": "q" * 2000}}
    compact = compact_plan(plan)
    assert CHECK["plans"].is_valid(plan) and CHECK["plans"].is_valid(compact)
    assert "content" not in compact["admitted"][0] and compact["request"]["query_truncated"]
