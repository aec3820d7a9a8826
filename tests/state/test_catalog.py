"""The DuckDB catalog: versions move forward, revocations apply, bad bundles change nothing."""

from __future__ import annotations

from datetime import datetime, timezone

import orjson
import pytest

from schemas.codec import decode
from agents.stream.clock_ticks import play_tick
from schemas.errors import InvalidEvent
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.events import envelope, resource, revoke_role


@pytest.fixture
def state(tmp_path):
    st = LocalState.open(tmp_path / "f.duckdb")
    for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines():
        item = orjson.loads(line)
        apply(st, item["topic"], item["event"])
    yield st
    st.close()


def apply(st: LocalState, topic: str, event: dict):
    decoded = decode(topic, None, orjson.dumps(event))
    payload = decoded.payload
    with st.store.transaction():
        if topic == "source-changes":
            return st.catalog.apply_source_change(payload, decoded.occurred_at)
        if topic == "policy-versions":
            return st.catalog.apply_policy(payload)
        if topic == "revocations":
            return st.catalog.apply_revocation(payload)
        ticked: dict = {}
        result = play_tick(payload, 0, payload.now, st.store.clocks(), ticked, None)
        st.store.set_clocks(ticked)
        return result


def test_versions_only_move_forward(state):
    keys = apply(state, *resource("w", version=3, content="v3"))
    assert "resource:w" in keys and "scope:ATLAS-IN-01/approved_waiver" in keys
    assert apply(state, *resource("w", version=2, content="v2")) is None
    assert apply(state, *resource("w", version=3, content="v3 again")) is None
    contract, _ = state.catalog.contract("credit.review.continuation")
    [w] = [r for r in state.catalog.candidates("ATLAS-IN-01", contract) if r.id == "w"]
    assert w.content == "v3"


def test_candidates_are_the_entitys_relevant_resources(state):
    contract, _ = state.catalog.contract("credit.review.continuation")
    ids = [r.id for r in state.catalog.candidates("ATLAS-IN-01", contract)]
    assert ids == sorted(["facility-F102", "investigation-X9", "policy-P2", "policy-P3", "rm-note-N7",
                          "workflow-E88"])
    # Not from credit-committee: the shipped bundle lets that group assert only waivers and committee records.
    apply(state, *resource("memo", cls="marketing_memo", supports=("brand_tone",), provenance_group="marketing"))
    assert "memo" not in [r.id for r in state.catalog.candidates("ATLAS-IN-01", contract)]


def test_delete_removes_a_resource_and_reports_its_keys(state):
    topic, event = resource("gone")
    apply(state, topic, event)
    delete = dict(event, event_id="del", op="delete", resource={"id": "gone"})
    assert "resource:gone" in apply(state, topic, delete)
    assert apply(state, topic, dict(delete, event_id="del-again")) is None


def test_revoked_role_is_gone_from_the_principal(state):
    assert state.catalog.principal("maya").roles == ("credit_analyst",)
    assert apply(state, *revoke_role("maya", "credit_analyst")) == ["principal:maya"]
    assert state.catalog.principal("maya").roles == ()


def test_invalid_cedar_bundle_is_rejected_whole(state):
    line = (SCENARIOS / "atlas.jsonl").read_text().splitlines()[0]
    event = orjson.loads(line)["event"]
    bad = dict(event, event_id="p-bad", version=2, cedar="permit(principal, action, resource) when {",
               decision_types={})
    with pytest.raises(InvalidEvent) as err:
        apply(state, "policy-versions", bad)
    assert err.value.error_class == "invalid_policy"
    contract, policy = state.catalog.contract("credit.review.continuation")
    assert policy.version == 1 and contract.purposes == ("annual_credit_review",)


def test_clock_never_moves_backwards(state):
    regression = apply(state, "clock", {"event_id": "c", "schema_version": 1, "occurred_at": "2026-08-30T00:00:00Z",
                                        "now": "2026-01-01T00:00:00Z"})
    assert isinstance(regression, InvalidEvent) and regression.error_class == "clock_regression"
    assert apply(state, "clock", {"event_id": "c2", "schema_version": 1, "occurred_at": "2026-08-30T00:00:00Z",
                                  "now": "2026-08-30T09:00:00Z"}) is None  # a repeat of the last tick
    assert state.store.now().isoformat() == "2026-08-30T09:00:00+00:00"
    ahead = {"event_id": "c3", "schema_version": 1, "occurred_at": "2026-08-30T00:00:00Z",
             "now": "2026-08-30T11:30:00.123456+02:00"}
    assert apply(state, "clock", ahead) == []
    # The writer remembers the tick as the file gives it back: in UTC.
    assert state.store.clocks() == {0: datetime(2026, 8, 30, 9, 30, 0, 123456, tzinfo=timezone.utc)}
    assert state.store.now().isoformat() == "2026-08-30T09:30:00.123456+00:00"
    with state.store.transaction():
        assert state.store.db.execute("SELECT now FROM clock WHERE id = 0").fetchone()[0] == state.store.now()


def _bundle(**changes) -> dict:
    event = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    return dict(event, **changes)


def test_a_future_policy_version_is_kept_and_governs_only_from_its_effective_at(state):
    keys = apply(state, "policy-versions", _bundle(event_id="p3", version=3, effective_at="2026-12-01T00:00:00Z"))
    assert "policy:credit" in keys
    now = datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
    december = datetime(2026, 12, 1, tzinfo=timezone.utc)
    _, policy = state.catalog.contract("credit.review.continuation", now)
    assert (policy.version, policy.superseded_at) == (1, december)
    _, policy = state.catalog.contract("credit.review.continuation", december)
    assert (policy.version, policy.superseded_at) == (3, None)
    assert state.catalog.contract("credit.review.continuation")[1].version == 3
    # Versions still only move forward, whatever their effective_at.
    assert apply(state, "policy-versions", _bundle(event_id="p2", version=2)) is None
    assert apply(state, "policy-versions", _bundle(event_id="p3b", version=3)) is None


def _maya(version: int, roles=("credit_analyst",), at: str = "2026-08-30T08:00:00Z") -> tuple[str, dict]:
    return "source-changes", dict(envelope(kind="principal", op="upsert", principal={
        "id": "maya", "roles": list(roles), "attributes": {"unit": "corporate-credit"},
        "delegation_version": version}), occurred_at=at)


def _revoke(at: str = "2026-08-30T09:05:00Z", **extra) -> tuple[str, dict]:
    topic, event = revoke_role("maya", "credit_analyst", **extra)
    return topic, dict(event, effective_at=at)


def test_a_revoked_role_comes_back_only_with_a_record_made_after_the_revocation(state):
    assert state.catalog.principal("maya").delegation_version == 3
    apply(state, *_revoke())
    apply(state, *_maya(3))                                   # a replay of what was revoked
    assert state.catalog.principal("maya").roles == ()
    assert apply(state, *_maya(2)) is None                    # older: ignored
    assert apply(state, *_maya(4)) == ["principal:maya"]      # a higher version made before the revocation
    assert state.catalog.principal("maya").roles == ()
    assert apply(state, *_maya(5, at="2026-08-30T09:10:00Z")) == ["principal:maya"]  # made after: re-granted
    assert state.catalog.principal("maya").roles == ("credit_analyst",)
    apply(state, *_revoke(at="2026-08-30T10:00:00Z"))         # revoked again, later
    assert state.catalog.principal("maya").roles == ()
    # A late copy of an earlier revocation keeps the latest effective_at: 09:10 stays withdrawn.
    apply(state, *_revoke(at="2026-08-30T09:00:00Z"))
    assert state.catalog.principal("maya").roles == ()
    assert apply(state, *_maya(6, at="2026-08-30T10:00:01Z")) is not None
    assert state.catalog.principal("maya").roles == ("credit_analyst",)


def test_a_revocation_carries_the_delegation_version_it_applies_as_of(state):
    topic, event = _revoke(delegation_version=5)              # issued against a version not seen yet
    apply(state, topic, event)
    apply(state, *_maya(5, at="2026-08-30T09:10:00Z"))        # made after, but at the version it names
    assert state.catalog.principal("maya").roles == ()
    apply(state, *_maya(6, at="2026-08-30T09:10:00Z"))
    assert state.catalog.principal("maya").roles == ("credit_analyst",)
    # A late copy carrying an older version cannot lower what the revocation applies as of.
    apply(state, topic, dict(event, event_id="late", delegation_version=6))
    apply(state, topic, dict(event, event_id="later", delegation_version=1))
    assert state.catalog.principal("maya").roles == ()


def test_a_stale_delegation_version_still_withdraws_from_records_made_before_it(state):
    apply(state, *_maya(4, at="2026-08-30T09:00:00Z"))
    apply(state, *_revoke(delegation_version=2))              # names a version below the stored one
    assert state.catalog.principal("maya").roles == ()
    assert state.store.counters().get("stale_revocation_versions") == 1


def test_a_revocation_before_its_principal_withdraws_from_records_made_before_it(state):
    apply(state, "revocations", envelope(principal="nia", revoke="role", value="credit_analyst",
                                         effective_at="2026-08-30T09:00:00Z"))
    nia = {"id": "nia", "roles": ["credit_analyst"], "attributes": {}, "delegation_version": 2}
    apply(state, "source-changes", dict(envelope(kind="principal", op="upsert", principal=nia),
                                        occurred_at="2026-08-30T08:59:59Z"))
    assert state.catalog.principal("nia").roles == ()
    apply(state, "source-changes", dict(envelope(kind="principal", op="upsert", principal=dict(
        nia, delegation_version=3)), occurred_at="2026-08-30T09:00:01Z"))
    assert state.catalog.principal("nia").roles == ("credit_analyst",)


def test_a_record_of_unknown_time_cannot_undo_a_revocation(state):
    apply(state, *_revoke())
    apply(state, *_maya(9, at="1970-01-01T00:00:00Z"))        # CDC without a commit time
    assert state.catalog.principal("maya").roles == ()
    assert state.store.counters().get("principal_time_unknown") == 1


def test_a_deleted_principal_comes_back_only_at_a_higher_version_made_after_the_delete(state):
    delete = ("source-changes", envelope(kind="principal", op="delete", principal={"id": "maya"}))
    assert apply(state, *delete) == ["principal:maya"]
    assert apply(state, *_maya(2)) is None and apply(state, *_maya(3)) is None
    assert state.catalog.principal("maya") is None
    assert apply(state, *_maya(4)) is None                    # higher, but made before the delete
    assert apply(state, *_maya(5, at="2026-08-30T09:30:00Z")) == ["principal:maya"]
    assert state.catalog.principal("maya").delegation_version == 5


def test_a_delete_read_before_its_principal_keeps_out_records_made_before_it(state):
    delete = ("source-changes", dict(envelope(kind="principal", op="delete", principal={"id": "zed"}),
                                     occurred_at="2026-08-30T09:00:00Z"))
    assert apply(state, *delete) == []
    zed = {"id": "zed", "roles": [], "attributes": {}, "delegation_version": 7}
    assert apply(state, "source-changes", dict(envelope(kind="principal", op="upsert", principal=zed),
                                               occurred_at="2026-08-30T08:00:00Z")) is None
    assert state.catalog.principal("zed") is None
    # The refused version 7 is remembered: only a higher one, made after the delete, brings zed back.
    assert apply(state, "source-changes", dict(envelope(kind="principal", op="upsert", principal=zed),
                                               occurred_at="2026-08-30T09:30:00Z")) is None
    assert apply(state, "source-changes", dict(envelope(kind="principal", op="upsert", principal=dict(
        zed, delegation_version=8)), occurred_at="2026-08-30T09:30:00Z")) == ["principal:zed"]


def test_observed_at_is_stored_and_an_older_file_gains_the_column(state, tmp_path):
    apply(state, *resource("w-seen", observed_at="2026-08-01T00:00:00Z"))
    contract, _ = state.catalog.contract("credit.review.continuation")
    seen = {r.id: r for r in state.catalog.candidates("ATLAS-IN-01", contract)}
    assert seen["w-seen"].observed_at.isoformat() == "2026-08-01T00:00:00+00:00"
    assert seen["facility-F102"].observed_at.isoformat() == "2026-08-29T09:00:00+00:00"  # the event's time
    # As a file from before the field (its index is recreated on open, so it may go too).
    state.store.db.execute("DROP INDEX resources_entity; ALTER TABLE resources DROP COLUMN observed_at")
    state.close()
    again = LocalState.open(tmp_path / "f.duckdb")
    try:
        rows = {r.id: r for r in again.catalog.candidates("ATLAS-IN-01", contract)}
        assert rows["w-seen"].observed_at is None  # ages from valid_from, as it always did
        apply(again, *resource("w-new"))
        assert {r.id for r in again.catalog.candidates("ATLAS-IN-01", contract)} >= {"w-new", "w-seen"}
    finally:
        again.close()


def test_entity_names_and_source_trust_announce_what_plans_depend_on(state):
    keys = apply(state, "source-changes", {"event_id": "e-cinder", "schema_version": 1,
                                           "occurred_at": "2026-08-30T00:00:00Z", "kind": "entity", "op": "upsert",
                                           "entity": {"id": "CINDER-CA-03", "aliases": ["Cinder Foods"]}})
    assert {"name-word:cinder", "name-word:foods", "name-word:ca"} <= set(keys)
    assert state.catalog.entities_named(["cinder foods", "boreal", "nobody"]) == {
        "cinder foods": ["CINDER-CA-03"], "boreal": ["BOREAL-UK-02"]}
    first = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    wider = dict(first["sources"], **{"waiver-desk": ["approved_waiver"]})
    keys = apply(state, "policy-versions", dict(first, event_id="v2", version=2, sources=wider))
    assert "trust:approved_waiver" in keys and "trust:facility_record" not in keys
    assert state.catalog.trusted_sources()["approved_waiver"] == {"credit-committee", "waiver-desk"}
    keys = apply(state, "policy-versions", dict(first, event_id="v3", version=3, sources=wider))
    assert not any(k.startswith("trust:") for k in keys)  # the same rules: nobody's trust changed


class Boom(Exception):
    pass


def _rolled_back(st: LocalState, topic: str, event: dict, read) -> object:
    """Apply an event and read through the catalog inside a transaction that then rolls back."""
    payload = decode(topic, None, orjson.dumps(event)).payload
    with pytest.raises(Boom), st.store.transaction():
        if topic == "policy-versions":
            st.catalog.apply_policy(payload)
        elif topic == "revocations":
            st.catalog.apply_revocation(payload)
        else:
            st.catalog.apply_source_change(payload)
        seen = read()
        raise Boom
    return seen


def test_catalog_lookups_the_writer_remembers_never_outlive_a_rolled_back_transaction(state):
    cinder = {"event_id": "e-cinder", "schema_version": 1, "occurred_at": "2026-08-30T00:00:00Z", "kind": "entity",
              "op": "upsert", "entity": {"id": "CINDER-CA-03", "aliases": ["Cinder Foods"]}}
    names = (["cinder foods"], ["Cinder Foods"])
    assert (state.catalog.entities_named(names[0]), state.catalog.entity_matches_many(names[1])) == (
        {}, {"Cinder Foods": []})
    assert _rolled_back(state, "source-changes", cinder, lambda: (
        state.catalog.entities_named(names[0]), state.catalog.entity_matches_many(names[1]))) == (
        {"cinder foods": ["CINDER-CA-03"]}, {"Cinder Foods": ["CINDER-CA-03"]})
    assert (state.catalog.entities_named(names[0]), state.catalog.entity_matches_many(names[1])) == (
        {}, {"Cinder Foods": []})

    first = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    before = (state.catalog.trusted_sources(), state.catalog.decision_types(),
              state.catalog.versions("credit.review.continuation"))
    v2 = dict(first, event_id="v2", version=2, sources={"credit-committee": ["approved_waiver"]},
              decision_types=dict(first["decision_types"],
                                  **{"credit.other": first["decision_types"]["credit.review.continuation"]}))
    inside = _rolled_back(state, "policy-versions", v2, lambda: (
        state.catalog.trusted_sources(), state.catalog.decision_types(),
        state.catalog.versions("credit.review.continuation")))
    assert inside != before and "credit.other" in inside[1]
    assert (state.catalog.trusted_sources(), state.catalog.decision_types(),
            state.catalog.versions("credit.review.continuation")) == before

    maya = state.catalog.principal("maya")
    assert maya is not None and "credit_analyst" in maya.roles
    assert "credit_analyst" not in _rolled_back(state, *revoke_role("maya", "credit_analyst"),
                                                lambda: state.catalog.principal("maya").roles)
    assert "credit_analyst" in state.catalog.principal("maya").roles


def test_a_reader_never_sees_catalog_writes_the_writer_has_not_committed(state):
    reader = state.reader()
    assert reader.catalog.entities_named(["cinder foods"]) == {}
    with state.store.transaction():
        apply(state, "source-changes", {"event_id": "e-cinder", "schema_version": 1,
                                        "occurred_at": "2026-08-30T00:00:00Z", "kind": "entity", "op": "upsert",
                                        "entity": {"id": "CINDER-CA-03", "aliases": ["Cinder Foods"]}})
        assert state.catalog.entities_named(["cinder foods"]) == {"cinder foods": ["CINDER-CA-03"]}
        assert reader.catalog.entities_named(["cinder foods"]) == {}
    assert reader.catalog.entities_named(["cinder foods"]) == {"cinder foods": ["CINDER-CA-03"]}


def test_a_resource_written_in_a_rolled_back_transaction_is_written_again_whole(state):
    assert apply(state, *resource("w", version=3, content="v3")) is not None
    contract, _ = state.catalog.contract("credit.review.continuation")
    assert _rolled_back(state, *resource("w", version=4, content="v4"), lambda: [
        r.content for r in state.catalog.candidates("ATLAS-IN-01", contract) if r.id == "w"]) == ["v4"]
    assert _rolled_back(state, *resource("w2", version=1, content="new"), lambda: [
        r.content for r in state.catalog.candidates("ATLAS-IN-01", contract) if r.id == "w2"]) == ["new"]
    assert apply(state, *resource("w", version=4, content="v4 again")) is not None  # not "older than stored"
    assert apply(state, *resource("w2", version=1, content="new again")) is not None
    assert {r.id: r.content for r in state.catalog.candidates("ATLAS-IN-01", contract) if r.id in ("w", "w2")} == {
        "w": "v4 again", "w2": "new again"}
    assert apply(state, *resource("w", version=4, content="repeat")) is None


def test_a_kept_version_keeps_its_source_trust_across_a_restart_and_an_older_file_reads_as_on(state, tmp_path):
    first = orjson.loads((SCENARIOS / "atlas.jsonl").read_text().splitlines()[0])["event"]
    apply(state, "policy-versions", dict(first, event_id="v2", version=2, source_trust=False))
    state.close()
    again = LocalState.open(tmp_path / "f.duckdb")  # a new process parses every kept version from the file
    try:
        _, policy = again.catalog.contract("credit.review.continuation")
        assert (policy.version, policy.trusted) == (2, None)
        _, v1 = again.catalog.contract("credit.review.continuation", datetime(2025, 1, 1, tzinfo=timezone.utc))
        assert v1.version == 1 and v1.trusted["approved_waiver"] == {"credit-committee"}
        # As a file from before the opt-out existed: its kept versions read as trust on.
        again.store.db.execute("ALTER TABLE policy_versions DROP COLUMN source_trust")
    finally:
        again.close()
    old = LocalState.open(tmp_path / "f.duckdb")
    try:
        _, policy = old.catalog.contract("credit.review.continuation")
        assert policy.version == 2 and policy.trusted == v1.trusted
    finally:
        old.close()
