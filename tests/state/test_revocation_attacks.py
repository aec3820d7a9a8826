"""Attacks on the revocation rule and its neighbours, from a hostile review of issue 27.

Each docstring tells the attack; the first seven failed on the first version of the rule.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

import orjson
import pytest

from agents.stream.event_apply import EventApplier, RawMessage
from agents.plans.plan_writer import PlanWriter
from schemas.records import Principal, Revocation, SourceChange
from state.local_state import LocalState

T = datetime(2026, 8, 30, 9, 0, tzinfo=timezone.utc)
M = timedelta(minutes=1)


def up(pid, roles, version, attributes=None):
    return SourceChange("principal", "upsert", pid, Principal(pid, tuple(roles), attributes or {}, version))


def delete(pid):
    return SourceChange("principal", "delete", pid, None)


def rev(pid, value, at, version=None, kind="role"):
    return Revocation(pid, kind, value, at, "iam", version)


def applied(path, events, batches=None):
    """Apply (item, time) pairs one batch at a time (default: one event per batch); the principals' state."""
    state = LocalState.open(path)
    try:
        batches = batches or [[e] for e in events]
        for batch in batches:
            with state.store.transaction():
                state.catalog.apply_identities([e for e, _ in batch], [t for _, t in batch])
        return {pid: (p.roles, dict(p.attributes), p.delegation_version)
                for pid, p in state.catalog.principals_many(["maya", "omar"]).items()}
    finally:
        state.close()


# ---------------------------------------------------------------------------------------------------
# 1. Principal deletes: the tombstone of an unknown principal has no version, a delete of a known one does.

def test_delete_then_recreate_at_same_version_depends_on_read_order(tmp_path):
    """v4 made 09:00, a delete made 09:10, v4 again made 09:20 (all on source-changes).

    Read in time order the delete keeps version 4 and the 09:20 record (not a higher version) is
    refused: maya stays deleted. Read with the delete first, the delete becomes a tombstone with
    no version, the 09:00 record is refused by time, and the 09:20 record re-creates maya:
    a deleted principal is active again in one read order only.
    """
    v4_0900 = (up("maya", ["credit_analyst"], 4), T)
    gone = (delete("maya"), T + 10 * M)
    v4_0920 = (up("maya", ["credit_analyst"], 4), T + 20 * M)
    in_time_order = applied(tmp_path / "a.duckdb", [v4_0900, gone, v4_0920])
    delete_first = applied(tmp_path / "b.duckdb", [gone, v4_0900, v4_0920])
    assert in_time_order == {}                       # holds: deleted
    assert delete_first == in_time_order, f"delete read first re-creates maya: {delete_first}"


def test_delete_of_unknown_principal_at_unknown_time_blocks_the_id_forever(tmp_path):
    """A delete read before any upsert, from a CDC record without commit time (epoch = unknown).

    The tombstone has neither version nor time, so `_recreates` is False for every later upsert,
    whatever its version or time: the principal can never be created again (an operator-visible
    outage; no counter, no log). Read after the upsert, the same delete keeps the version and a
    higher version re-creates.
    """
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    gone = (delete("maya"), epoch)
    v1 = (up("maya", ["credit_analyst"], 1), T)
    v9 = (up("maya", ["credit_analyst"], 9), T + 60 * M)
    assert applied(tmp_path / "a.duckdb", [v1, gone, v9])["maya"][2] == 9
    assert "maya" in applied(tmp_path / "b.duckdb", [gone, v1, v9]), "v9 made an hour later is refused forever"


# ---------------------------------------------------------------------------------------------------
# 2. Equal delegation versions: the last read wins, whatever its event time.

def test_equal_version_older_record_read_last_restores_a_removed_role(tmp_path):
    """IAM's record v4 at 09:00 lists credit_analyst and approver; at 09:10 it removes approver (v4 again:
    delegation_version tracks delegations, not roles). credit_analyst is revoked at 09:05.

    Read in time order: maya ends with credit_analyst re-granted (made after 09:05) and no approver.
    Read with the 09:00 record last (a redelivered or reordered copy), the older record overwrites
    the newer one at the same version: approver, which the newest record removed, is granted again.
    Event times are now stored, so the tie could be broken by time; it is not.
    """
    old = (up("maya", ["credit_analyst", "approver"], 4), T)
    new = (up("maya", ["credit_analyst"], 4), T + 10 * M)
    r = (rev("maya", "credit_analyst", T + 5 * M), T + 5 * M)
    in_time_order = applied(tmp_path / "a.duckdb", [old, r, new])
    older_last = applied(tmp_path / "b.duckdb", [r, new, old])
    assert in_time_order["maya"][0] == ("credit_analyst",)
    assert older_last == in_time_order, f"older copy read last: {older_last}"


# ---------------------------------------------------------------------------------------------------
# 3. Migration of a state file written before the change (48cc850).

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from agents.web.query import QueryService  # noqa: E402
from tests.conftest import ATLAS_REQUEST  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_offsets = itertools.count()

_OLD_BUILD = r"""
import itertools, sys, orjson
from agents.event_apply import EventApplier, RawMessage
from agents.plan_writer import PlanWriter
from agents.query import QueryService
from state.local_state import LocalState
path, scenarios = sys.argv[1], sys.argv[2]
n = itertools.count()
state = LocalState.open(path)
inv = EventApplier(state, PlanWriter(state, lambda name: f"x-{name}"))
events = [orjson.loads(l) for l in open(scenarios + "/atlas.jsonl").read().splitlines()]
def ev(eid, at, **body):
    return {"event_id": eid, "schema_version": 1, "occurred_at": at, **body}
events += [
    {"topic": "revocations", "event": ev("r-1", "2026-08-30T09:05:00Z", principal="maya", revoke="role",
                                         value="credit_analyst", effective_at="2026-08-30T09:05:00Z", issued_by="iam")},
    {"topic": "source-changes", "event": ev("s-5", "2026-08-30T09:10:00Z", kind="principal", op="upsert",
        principal={"id": "maya", "roles": ["credit_analyst"], "attributes": {"unit": "corporate-credit"},
                   "delegation_version": 5})}]
inv.apply([RawMessage(e["topic"], 0, next(n), b"k", orjson.dumps(e["event"])) for e in events])
request = orjson.loads(open(scenarios + "/atlas-request.json", "rb").read())
plan = QueryService(state, inv.plans).select(request)
print(orjson.dumps({"admitted": len(plan["admitted"]), "plan_id": plan["plan_id"]}).decode())
state.close()
"""


@pytest.fixture(scope="module")
def old_state(tmp_path_factory):
    """A state file written by 48cc850: maya revoked at 09:05 and re-granted by v5 made at 09:10, a plan cached."""
    root = tmp_path_factory.mktemp("old")
    code = root / "code"
    code.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "48cc850"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(code)], input=archive, check=True)
    out = subprocess.run([sys.executable, "-c", _OLD_BUILD, str(root / "old.duckdb"), str(code / "scenarios")],
                         cwd=code, env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "old.duckdb", orjson.loads(out.stdout.strip().splitlines()[-1])


def test_an_old_state_file_opens_and_gains_horizons(old_state, tmp_path):
    path, built = old_state
    assert built["admitted"] > 0  # the old code re-granted the role with v5
    copy = tmp_path / "m.duckdb"
    copy.write_bytes(path.read_bytes())
    state = LocalState.open(copy)
    try:
        cols = {r[0] for r in state.store.db.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'principals'").fetchall()}
        assert "made_at" in cols
        assert state.store.db.execute("SELECT principal FROM revocation_horizons").fetchall() == [("maya",)]
    finally:
        state.close()


def test_an_upgrade_changes_no_ones_access_so_no_cached_plan_is_stale(old_state, tmp_path):
    """A file of 48cc850: maya revoked at 09:05, re-granted by v5 at 09:10, a plan cached. Once migrated the
    role stays granted (the rule adds nothing to what stored revocations withdrew), so the cached plan is
    what a recompilation gives; a revocation after the upgrade still withdraws it.
    """
    path, built = old_state
    copy = tmp_path / "m.duckdb"
    copy.write_bytes(path.read_bytes())
    state = LocalState.open(copy)
    try:
        inv = EventApplier(state, PlanWriter(state, lambda name: f"x-{name}"))
        assert state.catalog.principal("maya").roles == ("credit_analyst",)
        served = QueryService(state, inv.plans).select(ATLAS_REQUEST)
        assert served["served_from"] == "cache" and len(served["admitted"]) == built["admitted"]
        assert served["plan_id"] == built["plan_id"]
        later = _env("r-after", "2026-08-30T10:00:00Z", principal="maya", revoke="role", value="credit_analyst",
                     effective_at="2026-08-30T10:00:00Z")
        inv.apply([RawMessage("revocations", 0, 10_000, b"maya", orjson.dumps(later))])  # past the file's offsets
        assert state.catalog.principal("maya").roles == ()
        assert QueryService(state, inv.plans).select(ATLAS_REQUEST)["admitted"] == []
    finally:
        state.close()


# ---------------------------------------------------------------------------------------------------
# 4. The clock's lead bound trusts the record's timestamp, which Kafka's default (CreateTime) lets the
#    producer set.

def _applier(tmp_path):
    state = LocalState.open(tmp_path / "c.duckdb")
    return state, EventApplier(state, PlanWriter(state, lambda name: f"x-{name}"))


_tick_ids = itertools.count()


def _tick(now: datetime, stamp: datetime | None) -> RawMessage:
    iso = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {"event_id": f"c-{next(_tick_ids)}", "schema_version": 1, "occurred_at": iso, "now": iso}
    return RawMessage("clock", 0, next(_offsets), None, orjson.dumps(event),
                      stamp.timestamp() if stamp is not None else None)


def test_clock_moves_years_ahead_when_the_producer_stamps_its_records(tmp_path):
    """Issue 27 item 8: eight ticks of +399 days. The new lead rule compares a tick with its record's
    broker timestamp, but with `message.timestamp.type=CreateTime` (Kafka's default, and Tansu's) that
    timestamp is whatever the producer wrote. A producer that stamps each tick with its own `now`
    (a replaying tool, a skewed host) moves event time 8.7 years past wall time, every step accepted.
    """
    state, applier = _applier(tmp_path)
    try:
        wall = datetime.now(timezone.utc).replace(microsecond=0)
        applier.apply([_tick(wall, wall)])
        for step in range(1, 9):
            at = wall + step * timedelta(days=399)
            applier.apply([_tick(at, at)])
        lead = state.store.now() - wall
        assert lead <= timedelta(days=400), f"event time leads wall time by {lead.days} days"
    finally:
        state.close()


def test_clock_lead_bound_against_honest_broker_timestamps(tmp_path):
    state, applier = _applier(tmp_path)
    try:
        wall = datetime.now(timezone.utc).replace(microsecond=0)
        applier.apply([_tick(wall, wall)])
        for step in range(1, 9):
            applier.apply([_tick(wall + step * timedelta(days=399), wall)])
        assert state.store.now() - wall <= timedelta(days=400)
    finally:
        state.close()


# ---------------------------------------------------------------------------------------------------
# 5. A principal record's event time is unbounded: one future-dated record outlives later revocations.

def test_a_principal_record_dated_ahead_of_its_publication_cannot_outlive_a_revocation(tmp_path):
    """IAM (or a CDC source with a skewed clock) stamps maya's v4 at 2030; the role is revoked today without a
    version, read after the record. Dated ahead of its publication by more than the skew bound, the record
    is taken as of unknown time: the revocation withdraws from it, and the worker counts it.
    """
    state, applier = _applier(tmp_path)
    try:
        applier.apply([_raw("source-changes", _env("s-2030", "2030-01-01T00:00:00Z", kind="principal", op="upsert",
                            principal={"id": "maya", "roles": ["credit_analyst"], "attributes": {},
                                       "delegation_version": 4}))])
        applier.apply([_raw("revocations", _env("r-now", "2026-08-30T09:05:00Z", principal="maya", revoke="role",
                            value="credit_analyst", effective_at="2026-08-30T09:05:00Z"))])
        assert state.catalog.principal("maya").roles == ()
        assert state.store.counters()["principal_time_ahead"] == 1
    finally:
        state.close()


# ---------------------------------------------------------------------------------------------------
# 6. Held: timezone spellings through the decoder, several revocations of one role, re-grant between.

def _raw(topic, event):
    return RawMessage(topic, 0, next(_offsets), b"maya", orjson.dumps(event), datetime.now(timezone.utc).timestamp())


def _env(eid, at, **body):
    return {"event_id": eid, "schema_version": 1, "occurred_at": at, **body}


@pytest.mark.parametrize("made, revoked", [("2026-08-30T11:04:59+02:00", True), ("2026-08-30T11:05:00+02:00", True),
                                           ("2026-08-30T11:05:00.000001+02:00", False),
                                           ("2026-08-30T04:05:01-05:00", False)])
@pytest.mark.parametrize("revocation_first", [True, False])
def test_timezone_spellings_compare_as_instants(tmp_path, made, revoked, revocation_first):
    state, applier = _applier(tmp_path)
    try:
        base = _raw("source-changes", _env("s-3", "2026-08-30T08:00:00Z", kind="principal", op="upsert",
                    principal={"id": "maya", "roles": ["credit_analyst"], "attributes": {}, "delegation_version": 3}))
        upsert = _raw("source-changes", _env("s-4", made, kind="principal", op="upsert",
                      principal={"id": "maya", "roles": ["credit_analyst"], "attributes": {}, "delegation_version": 4}))
        revocation = _raw("revocations", _env("r-1", "2026-08-30T09:05:00Z", principal="maya", revoke="role",
                          value="credit_analyst", effective_at="2026-08-30T09:05:00Z", issued_by="iam"))
        applier.apply([base])
        for m in ([revocation, upsert] if revocation_first else [upsert, revocation]):
            applier.apply([m])
        assert (state.catalog.principal("maya").roles == ()) is revoked
    finally:
        state.close()


def test_several_revocations_of_one_role_keep_the_latest_whatever_the_order(tmp_path):
    r1, r2 = (rev("maya", "a", T + 5 * M), T + 5 * M), (rev("maya", "a", T + 15 * M), T + 15 * M)
    v5 = (up("maya", ["a"], 5), T + 10 * M)
    v6 = (up("maya", ["a"], 6), T + 20 * M)
    for i, order in enumerate(itertools.permutations([r1, r2, v5])):
        assert applied(tmp_path / f"o{i}.duckdb", list(order))["maya"][0] == ()
    for i, order in enumerate(itertools.permutations([r1, r2, v5, v6])):
        assert applied(tmp_path / f"p{i}.duckdb", list(order), [list(order[:2]), list(order[2:])])["maya"][0] == ("a",)


def test_a_revocation_survives_delete_and_recreate_made_before_it(tmp_path):
    v4 = (up("maya", ["a"], 4), T)
    r = (rev("maya", "a", T + 5 * M), T + 5 * M)
    gone = (delete("maya"), T + 6 * M)
    back_early = (up("maya", ["a"], 5), T + 4 * M)    # higher version, made before the revocation
    back_late = (up("maya", ["a"], 6), T + 7 * M)
    for i, order in enumerate(itertools.permutations([r, gone, back_early])):
        got = applied(tmp_path / f"e{i}.duckdb", [v4, *order])
        assert got.get("maya", ((),))[0] == (), (order, got)
    assert applied(tmp_path / "late.duckdb", [v4, r, gone, back_late])["maya"][0] == ("a",)


# ---------------------------------------------------------------------------------------------------
# 8. Held: a conflicting event id on `revocations` revokes; repeats cost one dead letter each, nothing more.

def test_a_conflicting_revocation_revokes_and_repeats_only_dead_letter(tmp_path):
    state, applier = _applier(tmp_path)
    try:
        for pid in ("maya", "omar"):
            applier.apply([_raw("source-changes", _env(f"s-{pid}", "2026-08-30T08:00:00Z", kind="principal",
                                op="upsert", principal={"id": pid, "roles": ["credit_analyst"], "attributes": {},
                                                        "delegation_version": 3}))])
        applier.apply([_raw("revocations", _env("r-1", "2026-08-30T09:05:00Z", principal="omar", revoke="role",
                            value="credit_analyst", effective_at="2026-08-30T09:05:00Z", issued_by="iam"))])
        for _ in range(3):  # r-1 reused for maya
            applier.apply([_raw("revocations", _env("r-1", "2026-08-30T09:05:00Z", principal="maya",
                                revoke="role", value="credit_analyst", effective_at="2026-08-30T09:05:00Z"))])
        assert state.catalog.principal("maya").roles == () and state.catalog.principal("omar").roles == ()
        counters = state.store.counters()
        assert counters["conflicting_revocations_applied"] == 3
        letters = [t for _, t, _, _ in state.outbox.pending() if t == "x-dead-letters"]
        assert len(letters) == 3
    finally:
        state.close()


async def test_the_broker_keeps_a_producer_chosen_timestamp(broker):
    """Evidence for the clock finding: the embedded broker (CreateTime) returns the timestamp the producer set."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    bootstrap = broker.bootstrap_servers
    future_ms = int(datetime(2034, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait("review27-stamps", b"x", timestamp_ms=future_ms)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition("review27-stamps", meta.partition)
        consumer.assign([tp])
        consumer.seek(tp, meta.offset)
        record = (await consumer.getmany(tp, timeout_ms=10000))[tp][0]
    finally:
        await consumer.stop()
    assert record.timestamp == future_ms
