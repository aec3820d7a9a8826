"""JSON log lines carry ids and reason codes as fields."""

from __future__ import annotations

import logging

import orjson

from agents.logs import JsonLines


def test_json_lines_carry_extra_fields_and_no_surprises():
    record = logging.LogRecord("agents.invalidation", logging.INFO, __file__, 1, "invalidated plan %s (%s)",
                               ("plan-1", "scope_changed"), None)
    record.plan_id, record.reason, record.event_id = "plan-1", "scope_changed", "e-17"
    doc = orjson.loads(JsonLines().format(record))
    assert doc["msg"] == "invalidated plan plan-1 (scope_changed)" and doc["level"] == "info"
    assert (doc["plan_id"], doc["reason"], doc["event_id"]) == ("plan-1", "scope_changed", "e-17")
    assert doc["ts"].endswith("Z") and "args" not in doc
