"""Finding 13: dead letters say what was wrong without the value; HTTP answers do not confirm principals."""

from __future__ import annotations

import orjson
import pytest

from tests.conftest import ATLAS_REQUEST, SCENARIOS
from tests.events import envelope, resource, tick

pytestmark = pytest.mark.timeout(180)

SECRET = "sk-live-7f3a9c1e5b2d"
BUNDLE = {k: v for k, v in orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"].items()
          if k not in ("event_id", "schema_version", "occurred_at")}


async def test_dead_letter_messages_and_logs_never_repeat_the_bad_value(worker):
    fresh = await worker.load("atlas.jsonl")
    fresh = await worker.publish_events(("policy-versions", envelope(**dict(
        BUNDLE, version=2, sources={"credit-committee": ["approved_waiver"]}))))
    await worker.select(ATLAS_REQUEST, fresh)
    _, waiver = resource("w-leak")
    with_resource = lambda **fields: orjson.dumps(dict(waiver, resource=dict(waiver["resource"], **fields)))  # noqa: E731
    bad = [
        ("source-changes", b"l1", with_resource(valid_from=SECRET)),                     # invalid_value
        ("source-changes", b"l2", with_resource(tokens=SECRET)),                         # schema_violation
        ("source-changes", b"l3", orjson.dumps(dict(waiver, occurred_at=SECRET))),       # invalid_value
        ("source-changes", b"l4", with_resource(evidence_class=f"class-{SECRET}")),      # class_not_allowed
        ("clock", None, orjson.dumps(tick(SECRET)[1])),                                  # invalid_value
        ("revocations", b"maya", orjson.dumps(envelope(principal="maya", revoke="role", value="x",
                                                       effective_at=SECRET, issued_by="iam"))),
        ("policy-versions", b"credit", orjson.dumps(envelope(**dict(BUNDLE, version=3,
                                                                   cedar=f"permit( {SECRET}")))),  # invalid_policy
        ("source-changes", b"l5", b'{"event_id": "' + SECRET.encode() + b'", '),       # malformed_json
    ]
    await worker.publish(bad)
    # The keyless tick goes to both clock partitions: nine dead letters.
    letters = await worker.records("dead-letters", lambda rs: len(rs) >= len(bad) + 1)
    assert sorted(r["error_class"] for r in letters) == sorted(
        ["invalid_value"] * 5 + ["schema_violation", "class_not_allowed_for_source", "invalid_policy",
         "malformed_json"])
    for letter in letters:
        assert SECRET not in letter["message"], letter
    by_class = {r["error_class"]: r["message"] for r in letters}
    assert "valid_from" in next(r["message"] for r in letters if r["_key"] == b"l1")  # names the field
    assert "tokens" in by_class["schema_violation"]
    assert SECRET not in worker.log_path.read_text()


async def test_an_unknown_principal_is_answered_as_a_known_one_without_rights(worker):
    fresh = await worker.load("atlas.jsonl")
    fresh = await worker.publish_events(("source-changes", envelope(
        kind="principal", op="upsert", principal={"id": "rita", "roles": [], "attributes": {}})))
    rightless = await worker.select(dict(ATLAS_REQUEST, principal="rita"), fresh)
    unknown = await worker.select(dict(ATLAS_REQUEST, principal="mallory"), fresh)
    shape = ("state", "admitted", "rejected", "withheld", "slots", "stop_reason", "budget_spent")
    assert [unknown[k] for k in shape] == [rightless[k] for k in shape]
    assert unknown["admitted"] == [] and unknown["withheld"] > 0
    assert sorted(unknown) == sorted(rightless)
    # Publishing the principal invalidates what was compiled while it was unknown.
    granted = await worker.publish_events(("source-changes", envelope(
        kind="principal", op="upsert", principal={"id": "mallory", "roles": ["credit_analyst"],
                                                  "attributes": {}})))
    now_known = await worker.select(dict(ATLAS_REQUEST, principal="mallory"), granted)
    assert now_known["admitted"] and now_known["plan_id"] != unknown["plan_id"]
    assert (await worker.get(f"/v1/plans/{unknown['plan_id']}"))["status"] == "invalidated"
