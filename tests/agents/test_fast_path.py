"""Early announcements from memory over a real DuckDB file: what is announced, what selects and the writer see."""

from __future__ import annotations

import asyncio
import itertools

import orjson
import pytest

from agents.plans.backlog import recompile_queued
from agents.plans.plan_writer import PlanWriter
from agents.stream.event_apply import EventApplier, RawMessage
from agents.stream.fast_path import FastPath
from agents.web.early_waits import EarlyWaits
from agents.web.query import QueryService
from compiler.errors import RequestError
from schemas.codec import decode
from state.local_state import LocalState
from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST
from tests.events import envelope, resource, revoke_role

pytestmark = pytest.mark.timeout(60)

_offsets = itertools.count(1_000)


class Sent:
    """A stand-in producer: records what was sent; acknowledges at once unless told to hold."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.hold = False
        self.acks: list[asyncio.Future] = []

    async def send(self, topic: str, key: bytes, value: bytes) -> asyncio.Future:
        self.records.append(orjson.loads(value))
        ack = asyncio.get_running_loop().create_future()
        if not self.hold:
            ack.set_result(None)
        self.acks.append(ack)
        return ack

    def release(self) -> None:
        """Acknowledge what was held: a test must end with no send pending on its loop (a task destroyed pending
        is logged wherever logging goes when it is collected, in another test of the same process)."""
        for ack in self.acks:
            if not ack.done():
                ack.set_result(None)


def raw(topic: str, event: dict, offset: int | None = None) -> RawMessage:
    return RawMessage(topic, 0, next(_offsets) if offset is None else offset, b"k", orjson.dumps(event))


@pytest.fixture
def world(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    sent = Sent()
    owned = {"yes": True}
    holder: dict = {}
    fast = FastPath(state.store.heads, owns=lambda entity_id: owned["yes"], send=sent.send,
                    topic_of=lambda name: f"x-{name}",
                    decode=lambda m: decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}"),
                    applied=lambda t, p, o: state.store.next_offsets().get(t, {}).get(p, 0) > o,
                    event_time=lambda: None)
    writer = PlanWriter(state, lambda name: f"x-{name}", sent_early=fast.acknowledged)
    applier = EventApplier(state, writer, early=fast.announced)
    applier.apply([raw(item["topic"], item["event"], offset=i) for i, item in
                   enumerate(map(orjson.loads, (SCENARIOS / "atlas.jsonl").read_text().splitlines()))])
    holder.update(state=state, fast=fast, sent=sent, applier=applier, owned=owned,
                  query=QueryService(state, writer))
    yield holder
    state.close()


def admitted(plan: dict) -> tuple[str, int]:
    """A resource the plan admitted, and the version it admitted."""
    item = plan["admitted"][0]
    return item["resource_id"], item["version"]


def edit_of(state: LocalState, rid: str, version: int) -> tuple[str, dict]:
    """An upsert of a stored resource as a new version (every other column as stored)."""
    row = state.store.db.execute("SELECT entity, evidence_class, supports, valid_from, valid_to, provenance_group "
                                 "FROM resources WHERE id = ?", [rid]).fetchone()
    entity, cls, supports, valid_from, valid_to, group = row
    return resource(rid, entity=entity, version=version, cls=cls, supports=tuple(supports or ()),
                    valid_from=valid_from.isoformat().replace("+00:00", "Z"),
                    valid_to=valid_to and valid_to.isoformat().replace("+00:00", "Z"),
                    provenance_group=group, content=f"revision {version}")


def invalidations(state: LocalState) -> list[dict]:
    return [orjson.loads(v) for _, t, _, v in state.outbox.pending() if t == "x-plan-invalidations"]


async def test_an_edit_of_an_admitted_resource_is_announced_before_it_is_applied(world):
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    message = raw(*edit_of(state, rid, version + 1))
    assert fast.announce([message]) == 1
    await fast.settle()
    assert [(r["plan_id"], r["cause"]["offset"], r["cause"]["dependency_key"]) for r in sent.records] == [
        (plan["plan_id"], message.offset, f"resource:{rid}")]
    assert state.store.heads.head(plan["plan_key"]) is None  # no cached hit after the announcement
    assert fast.waiting(plan["plan_key"]) == ("source-changes", 0, message.offset)
    assert query.plan_status(plan["plan_id"])["status"] != "invalidated"  # the file has not applied it yet

    world["applier"].apply([message])
    assert query.plan_status(plan["plan_id"])["status"] == "invalidated"
    assert fast.waiting(plan["plan_key"]) is None
    assert invalidations(state) == [], "the writer queued again what the broker had acknowledged"


async def test_an_announcement_not_acknowledged_in_time_is_queued_again_by_the_writer(world):
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    sent.hold = True
    message = raw(*edit_of(state, rid, version + 1))
    fast.announce([message])
    await fast.settle(0.05)
    try:
        world["applier"].apply([message])
        queued = invalidations(state)
        assert [(r["plan_id"], r["cause"]["offset"]) for r in queued] == [(plan["plan_id"], message.offset)], \
            "an announcement the broker never acknowledged must be sent again (at least once, same cause)"
        assert queued[0]["cause"] == sent.records[0]["cause"]
    finally:
        sent.release()
        await fast.settle()


async def test_old_versions_foreign_plans_and_invalid_records_are_left_to_the_writer(world):
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    assert fast.announce([raw(*edit_of(state, rid, version))]) == 0  # not newer than what the plan admitted
    topic, event = edit_of(state, rid, version + 1)
    broken = dict(event, resource=dict(event["resource"], tokens="many"))  # peekable, but fails validation
    assert fast.announce([raw(topic, broken)]) == 0
    world["owned"]["yes"] = False
    assert fast.announce([raw(topic, event)]) == 0  # another worker owns the plan
    assert sent.records == [] and state.store.heads.head(plan["plan_key"]) is not None
    assert fast.figures()["early_skipped_invalid"] == 1


async def test_nothing_is_announced_early_while_the_writer_is_behind(world):
    """A select of a plan announced early waits for its event: under a backlog the writer announces instead."""
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    fast.behind = lambda: True
    message = raw(*edit_of(state, rid, version + 1))
    assert fast.announce([message]) == 0
    assert sent.records == [] and fast.waiting(plan["plan_key"]) is None
    assert state.store.heads.head(plan["plan_key"]) is not None
    assert fast.figures()["early_skipped_behind"] == 1
    world["applier"].apply([message])
    assert [r["plan_id"] for r in invalidations(state)] == [plan["plan_id"]]  # the writer's, as before


async def test_an_announced_plan_is_invalidated_even_when_applying_finds_nothing_to_change(world):
    """The event id was applied before with other content: the writer refuses the event (a dead letter) and
    changes nothing, but subscribers were told."""
    state, fast, query = world["state"], world["fast"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    topic, first = edit_of(state, rid, version + 1)
    world["applier"].apply([raw(topic, first)])
    while recompile_queued(world["applier"].plans, 16):
        pass
    successor = query.select(ATLAS_REQUEST)
    again = dict(first, resource=dict(first["resource"], version=version + 2))  # same event id, other content
    message = raw(topic, again)
    assert fast.announce([message]) == 1
    world["applier"].apply([message])
    assert state.store.counters()["dead_letters.event_id_conflict"] == 1
    assert query.plan_status(successor["plan_id"])["status"] == "invalidated"


async def test_a_head_committed_while_a_newer_edit_waits_is_announced_at_once(world):
    """The successor was compiled before the edit was applied: it is stale when it arrives."""
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    first, second = raw(*edit_of(state, rid, version + 1)), raw(*edit_of(state, rid, version + 2))
    fast.announce([first])  # the head is announced; the next edit finds no head
    assert fast.announce([second]) == 0
    world["applier"].apply([first])  # the writer applies only the first yet
    while recompile_queued(world["applier"].plans, 16):
        pass
    await asyncio.sleep(0)  # the head cache tells the fast path on the loop
    await fast.settle()
    successor = query.plan_status(plan["plan_id"])["successor_plan_id"]
    assert successor is not None
    assert [(r["plan_id"], r["cause"]["offset"]) for r in sent.records] == [
        (plan["plan_id"], first.offset), (successor, second.offset)]


async def _on_writer(fn, *args):
    return fn(*args)


def _announced_edit(world) -> tuple[dict, str, int, RawMessage, asyncio.Event]:
    """A selected plan, an edit of its evidence announced early, and the event that says it was applied."""
    state, fast, query = world["state"], world["fast"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    message = raw(*edit_of(state, rid, version + 1))
    applied = asyncio.Event()

    async def wait_applied(topic: str, partition: int, offset: int) -> None:
        await applied.wait()

    query.early = EarlyWaits(fast.waiting, wait_applied, seconds=5.0)
    fast.announce([message])
    return plan, rid, version, message, applied


async def test_a_select_of_an_announced_plan_waits_for_the_writer(world):
    state, fast, query = world["state"], world["fast"], world["query"]
    plan, rid, version, message, applied = _announced_edit(world)
    run = _on_writer
    selecting = asyncio.ensure_future(query.select_async(ATLAS_REQUEST, run))
    await asyncio.sleep(0.1)
    assert not selecting.done(), "a select answered with a plan already announced invalid"
    world["applier"].apply([message])
    applied.set()
    answer = await selecting
    assert answer["plan_id"] != plan["plan_id"]

    query.early = EarlyWaits(fast.waiting, None)  # a waiter that never returns: refused, not answered
    fast.announce([raw(*edit_of(state, rid, version + 3))])
    with pytest.raises(RequestError) as refused:
        await query.select_async(ATLAS_REQUEST, run)
    assert refused.value.status == 503 and refused.value.code == "plan_being_replaced"


async def test_a_select_that_waited_for_an_announced_edit_is_answered_as_recompiled_not_from_cache(world):
    """The plan asked for was announced invalid: missing as asked. The successor the backlog stored while the
    select waited is what it answers, as `recompiled` (the bench counts cache hits apart from such waits)."""
    state, query = world["state"], world["query"]
    plan, _, _, message, applied = _announced_edit(world)
    selecting = asyncio.ensure_future(query.select_async(ATLAS_REQUEST, _on_writer))
    await asyncio.sleep(0.05)
    world["applier"].apply([message])
    while recompile_queued(world["applier"].plans, 16):
        pass
    successor = state.plans.fresh_plan(plan["plan_key"])["plan_id"]
    applied.set()
    answer = await asyncio.wait_for(selecting, 5)
    assert answer["plan_id"] == successor != plan["plan_id"]
    assert answer["served_from"] == "recompiled"
    assert query.select(ATLAS_REQUEST)["served_from"] == "cache"  # asked now, it is fresh as asked


async def test_a_read_whose_snapshot_predates_the_apply_of_an_announced_edit_is_read_again(world):
    """The edit is announced, a select's file read takes its snapshot, the edit is applied, then the read returns
    the plan it found fresh in its snapshot: nothing is waiting any more, but the plan was announced, so the select
    reads again. (Found through the broker under load: a select sent after the announcement answered the plan.)"""
    state, fast, query = world["state"], world["fast"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    message = raw(*edit_of(state, rid, version + 1))
    query.early = EarlyWaits(fast.waiting, None, fast.was_announced, seconds=5.0)
    assert fast.announce([message]) == 1  # the head leaves the cache: the select reads the file
    reads = []

    async def read(lookup):
        if not reads:  # the first read's snapshot predates the apply that follows it
            found = lookup(state)
            world["applier"].apply([message])
            fast.forget_applied()
            reads.append(found)
            return found
        reads.append(lookup(state))
        return reads[-1]

    async def run(fn, *args):
        return fn(*args)

    answer = await query.select_async(ATLAS_REQUEST, run, read)
    assert len(reads) == 2 and answer["plan_id"] != plan["plan_id"]
    assert query.selects["selects.read_again_after_early_announcement"] == 1


async def test_a_withdrawal_from_the_principal_is_announced_before_it_is_applied(world):
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    message = raw(*revoke_role(ATLAS_REQUEST["principal"], "credit_analyst"))
    assert fast.announce([message]) == 1
    await fast.settle()
    assert [(r["plan_id"], r["cause"]["dependency_key"]) for r in sent.records] == [
        (plan["plan_id"], f"principal:{ATLAS_REQUEST['principal']}")]
    assert fast.waiting(plan["plan_key"]) == ("revocations", 0, message.offset)
    world["applier"].apply([message])
    assert query.plan_status(plan["plan_id"])["status"] == "invalidated"
    assert invalidations(state) == []


async def test_a_head_compiled_while_a_withdrawal_waits_is_announced_when_held(world):
    fast, sent, query = world["fast"], world["sent"], world["query"]
    message = raw(*revoke_role(ATLAS_REQUEST["principal"], "credit_analyst"))
    assert fast.announce([message]) == 0  # nothing held yet
    plan = query.select(ATLAS_REQUEST)  # compiled before the withdrawal is applied
    await asyncio.sleep(0)
    await fast.settle()
    assert [(r["plan_id"], r["cause"]["offset"]) for r in sent.records] == [(plan["plan_id"], message.offset)]


async def test_withdrawals_from_principals_with_no_held_head_are_never_decoded(world):
    """A flood of revocations of other principals costs the loop a glance each, not a validation."""
    fast, query = world["fast"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    decoded = []
    real = fast.decode
    fast.decode = lambda m: decoded.append(m.offset) or real(m)
    others = [raw(*revoke_role(f"someone-{i}", "credit_analyst")) for i in range(50)]
    mine = raw(*revoke_role(ATLAS_REQUEST["principal"], "credit_analyst"))
    assert fast.announce(others + [mine]) == 1
    assert decoded == [mine.offset]
    await fast.settle()
    assert fast.waiting(plan["plan_key"]) == ("revocations", 0, mine.offset)


async def test_a_batch_spends_a_bounded_number_of_decodes_and_leaves_the_rest_to_the_writer(world, monkeypatch):
    """Edits of held resources past the batch's decode budget are announced by the writer, not on the loop."""
    import agents.stream.fast_path as fast_path
    monkeypatch.setattr(fast_path, "MOST_DECODES_PER_BATCH", 2)
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    old = [raw(*edit_of(state, rid, version)) for _ in range(2)]  # decoded, not newer: nothing announced
    newer = raw(*edit_of(state, rid, version + 1))
    assert fast.announce(old + [newer]) == 0
    assert sent.records == [] and fast.figures()["early_skipped_busy"] == 1
    assert fast.announce([newer]) == 1  # the next batch has its budget again
    world["applier"].apply(old + [newer])
    assert query.plan_status(plan["plan_id"])["status"] == "invalidated"


def test_a_held_head_is_indexed_under_what_it_admitted_until_it_goes(world):
    state, query = world["state"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    heads = state.store.heads
    assert [(a.plan_id, a.version) for a in heads.admitting(rid)] == [(plan["plan_id"], version)]
    assert [a.plan_id for a in heads.asked_by(ATLAS_REQUEST["principal"])] == [plan["plan_id"]]
    heads.remove_keys([plan["plan_key"]])
    assert heads.admitting(rid) == [] and heads.admitted_by(plan["plan_key"]) == []
    assert heads.asked_by(ATLAS_REQUEST["principal"]) == [] and heads.principal_of(plan["plan_key"]) is None


def test_an_envelope_peeks_its_version():
    from schemas.shard_peek import peek
    _, event = resource("r-1", version=7)
    assert peek(orjson.dumps(event)).version == 7
    assert peek(orjson.dumps(dict(event, resource=dict(event["resource"], version="7")))).version is None
    assert peek(orjson.dumps(envelope(kind="principal", op="upsert", principal={"id": "p"}))).version is None


async def test_a_successor_stale_when_stored_is_announced_before_its_commit_and_once(world):
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    first, second = raw(*edit_of(state, rid, version + 1)), raw(*edit_of(state, rid, version + 2))
    fast.announce([first])
    fast.announce([second])  # fetched while the writer has applied neither
    await fast.settle()
    world["applier"].apply([first])
    seen_at_commit: list[list] = []
    commit = state.store.heads.committed

    loop = fast._loop = asyncio.get_running_loop()

    def committed(*args, **kwargs):
        # Give the loop its turn first, as a busy writer does: the check the store handed it runs before the commit.
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), loop).result()
        seen_at_commit.append([r["plan_id"] for r in sent.records])
        return commit(*args, **kwargs)

    state.store.heads.committed = committed
    task = asyncio.ensure_future(asyncio.to_thread(recompile_queued, world["applier"].plans, 16))
    await task  # the store hands the check to this loop; it runs as soon as the loop is free
    state.store.heads.committed = commit
    await asyncio.sleep(0)
    await fast.settle()
    successor = query.plan_status(plan["plan_id"])["successor_plan_id"]
    assert seen_at_commit == [[plan["plan_id"], successor]]  # sent before the successor's transaction committed
    assert [(r["plan_id"], r["cause"]["offset"]) for r in sent.records] == [
        (plan["plan_id"], first.offset), (successor, second.offset)]  # once, though held again after the commit
    figures = fast.figures()
    assert figures["early_announcements_before_commit"] == 1 and "early_announcements_of_new_heads" not in figures
    world["applier"].apply([second])
    assert query.plan_status(successor)["status"] == "invalidated"
    assert invalidations(state) == []  # the broker had both: the writer queued neither again


async def test_a_head_announced_as_it_was_stored_and_then_rolled_back_leaves_nothing_wrong(world, monkeypatch):
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    rid, version = admitted(plan)
    first, second = raw(*edit_of(state, rid, version + 1)), raw(*edit_of(state, rid, version + 2))
    fast.announce([first])
    fast.announce([second])
    world["applier"].apply([first])

    def broken(*args, **kwargs):
        raise OSError("disk gone while storing edges")

    with monkeypatch.context() as m:
        m.setattr(state.index, "replace_many", broken)
        with pytest.raises(OSError):
            recompile_queued(world["applier"].plans, 16)
    await asyncio.sleep(0)
    await fast.settle()
    [_, (never, cause)] = [(r["plan_id"], r["cause"]["offset"]) for r in sent.records]
    assert cause == second.offset and query.plan_status(never) is None  # announced, never stored: nobody has it
    assert state.store.heads.head(plan["plan_key"]) is None
    world["applier"].apply([second])
    while recompile_queued(world["applier"].plans, 16):
        pass
    answer = query.select(ATLAS_REQUEST)
    assert answer["served_from"] == "cache" and answer["plan_id"] not in {plan["plan_id"], never}
    assert {i["resource_id"]: i["version"] for i in answer["admitted"]}[rid] == version + 2
