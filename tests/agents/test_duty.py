"""Input duty: partitions taken on at the group's offset, the group's offset committed to what was published only."""

from __future__ import annotations

import asyncio
import signal

import pytest

from agents.stream.duty import Duty, commit_targets
from agents.cli.loader import publish
from agents.stream.writer import inline
from faust.types import TP
from state.local_state import LocalState
from streams.admin import GroupOffsets
from streams.broker import EmbeddedBroker
from streams.settings import INPUT_TOPICS, Settings
from tests.conftest import ATLAS_REQUEST, WorkerProcess, auth_header, eventually, start_peer
from tests.hostile.test_input_reset import _spawn, _stop, _wait_health

pytestmark = pytest.mark.timeout(120)

TOPICS = {"source-changes": "t-source-changes", "revocations": "t-revocations"}
SC = "source-changes"


class Consumer:
    """Faust's consumer as Duty sees it: an assignment, pausing, and commits the group accepts or refuses."""

    def __init__(self, assigned: set[TP]) -> None:
        self.assigned = assigned
        self.paused: set[TP] = set()
        self.commits: list[dict[TP, int]] = []
        self.accept = True

    def assignment(self) -> set[TP]:
        return set(self.assigned)

    def pause_partitions(self, tps) -> None:
        self.paused.update(tps)

    async def _commit_offsets(self, offsets) -> bool:
        self.commits.append(dict(offsets))
        return self.accept


class App:
    def __init__(self, assigned: set[TP]) -> None:
        self.rebalancing = False
        self.consumer = Consumer(assigned)


class Committed:
    """The group's committed offsets as GroupOffsets reads them."""

    def __init__(self, offsets: dict[tuple[str, int], int]) -> None:
        self.offsets = offsets

    async def read(self, topics: dict[str, str]) -> dict[tuple[str, int], int]:
        assert set(topics.values()) == set(TOPICS)  # broker-side names -> logical
        return dict(self.offsets)


@pytest.fixture
def state(tmp_path):
    opened = LocalState.open(tmp_path / "f.duckdb")
    yield opened
    opened.close()


def _duty(state: LocalState, assigned: set[TP], committed: dict | None = None, verified=lambda: True) -> Duty:
    kicks = []
    duty = Duty(state, App(assigned), inline, TOPICS, Committed(committed or {}), kick=lambda: kicks.append(1),
                verified=verified)
    duty.kicks = kicks
    return duty


def _applied(state: LocalState, partition: int, next_offset: int, caused: list[int] = (), standby=True) -> None:
    """The replica applied `source-changes` up to `next_offset`; each offset in `caused` queued one record."""
    with state.store.transaction():
        state.store.save_offsets({(SC, partition): next_offset})
        for offset in caused:
            state.outbox.add_many([("out", b"k", f"{partition}@{offset}".encode())], [(SC, partition, offset)],
                                  standby=standby)


def _rows(state: LocalState) -> list[tuple]:
    return state.store.db.execute("SELECT src_partition, src_offset, standby FROM outbox ORDER BY ALL").fetchall()


def _acknowledged(state: LocalState) -> None:
    """What the publisher does once the broker acknowledged everything due."""
    with state.store.transaction():
        state.outbox.remove([seq for seq, *_ in state.outbox.pending(1000)])


def test_the_commit_target_is_the_first_event_not_applied_or_not_acknowledged():
    floors = {(SC, 0): 0, (SC, 1): 5, (SC, 2): 0, ("revocations", 0): 3}
    applied = {SC: {0: 10, 1: 5, 2: 8}, "revocations": {0: 2}}
    assert commit_targets(floors, applied, {(SC, 0): 4}) == {(SC, 0): 4, (SC, 2): 8}


async def test_a_record_still_queued_holds_the_group_offset_at_the_event_that_caused_it(state):
    duty = _duty(state, {TP("t-source-changes", 0)})
    _applied(state, 0, 10, caused=[3])
    _applied(state, 1, 10, caused=[1])  # another worker's partition: not this worker's to hold or commit
    await duty.follow()
    assert _rows(state) == [(0, 3, False), (1, 1, True)] and duty.kicks
    assert await duty.commit() == {(SC, 0): 3}
    assert await duty.commit() == {}  # nothing new
    _applied(state, 0, 12, caused=[11])  # on standby until the replica's batch is promoted
    assert await duty.commit() == {}
    _acknowledged(state)
    assert await duty.commit() == {(SC, 0): 11}
    with state.store.transaction():
        state.outbox.promote(SC, 0, 11, 11)
    _acknowledged(state)
    assert await duty.commit() == {(SC, 0): 12}
    assert duty.app.consumer.commits == [{TP("t-source-changes", 0): 3}, {TP("t-source-changes", 0): 11},
                                         {TP("t-source-changes", 0): 12}]
    assert duty.committed_by_topic() == {SC: {0: 12}}


async def test_an_acknowledged_record_not_deleted_yet_holds_nothing_back(state):
    duty = _duty(state, {TP("t-source-changes", 0)})
    _applied(state, 0, 10, caused=[3], standby=False)
    await duty.follow()
    assert await duty.commit() == {(SC, 0): 3}
    # Acknowledged: its row waits for the next apply batch (or the idle timer) to delete it.
    state.outbox.acked.add([seq for seq, *_ in state.outbox.pending(1000)])
    assert await duty.commit() == {(SC, 0): 10} and _rows(state) == [(0, 3, False)]


async def test_a_partition_is_taken_on_at_the_group_offset_and_what_came_before_is_left_to_its_publisher(state):
    _applied(state, 0, 9, caused=[2, 7])
    duty = _duty(state, {TP("t-source-changes", 0)}, committed={(SC, 0): 5})
    await duty.follow()
    assert _rows(state) == [(0, 7, False)]
    assert duty.owned() == {SC: {0: 5}}
    assert await duty.commit() == {(SC, 0): 7}  # 7 is not acknowledged yet
    _acknowledged(state)
    assert await duty.commit() == {(SC, 0): 9}


async def test_a_take_on_whose_promote_fails_is_retried_on_the_next_round(state):
    _applied(state, 0, 9, caused=[7])
    duty = _duty(state, {TP("t-source-changes", 0)}, committed={(SC, 0): 5})
    failing = [True]

    async def run(fn, *args):
        if failing.pop() if failing else False:
            raise OSError("the state file could not be written")
        return await inline(fn, *args)

    duty.run_writes = run
    with pytest.raises(OSError):
        await duty.follow()
    assert duty.owned() == {} and _rows(state) == [(0, 7, True)]  # not taken on: nothing promoted
    await duty.follow()
    assert duty.owned() == {SC: {0: 5}} and _rows(state) == [(0, 7, False)]


async def test_nothing_is_committed_before_the_replica_reaches_the_group_offset(state):
    _applied(state, 0, 3)
    duty = _duty(state, {TP("t-source-changes", 0)}, committed={(SC, 0): 5})
    await duty.follow()
    assert await duty.commit() == {}
    _applied(state, 0, 4, caused=[3])  # an event before the floor: published by the previous owner
    assert await duty.commit() == {}
    _applied(state, 0, 7)
    assert await duty.commit() == {(SC, 0): 7}
    assert _rows(state) == [(0, 3, True)]  # left for pruning


async def test_a_partition_lost_is_forgotten_and_a_refused_commit_is_tried_again(state):
    _applied(state, 0, 4)
    _applied(state, 1, 6)
    duty = _duty(state, {TP("t-source-changes", 0), TP("t-source-changes", 1)})
    duty.app.consumer.accept = False  # the group rebalanced meanwhile
    await duty.follow()
    assert await duty.commit() == {} and duty.committed == {}
    duty.app.consumer.accept = True
    duty.app.consumer.assigned = {TP("t-source-changes", 1)}
    await duty.follow()
    assert duty.owned() == {SC: {1: 0}}
    assert await duty.commit() == {(SC, 1): 6}


async def test_offsets_of_another_broker_incarnation_are_never_taken_on_or_committed(state):
    _applied(state, 0, 40, caused=[3])  # offsets recorded against topics since reset (not rebased yet, or blocked)
    verified = False
    duty = _duty(state, {TP("t-source-changes", 0)}, verified=lambda: verified)
    await duty.follow()
    assert duty.owned() == {} and await duty.commit() == {} and duty.app.consumer.commits == []
    assert _rows(state) == [(0, 3, True)]
    verified = True
    await duty.follow()
    assert duty.owned() == {SC: {0: 0}} and await duty.commit() == {(SC, 0): 3}
    duty.floors[(SC, 1)] = 0
    verified = False  # a topic blocked later (its position lost): its offsets are no longer this broker's
    _acknowledged(state)
    assert await duty.commit() == {}


async def test_only_the_input_partitions_are_kept_from_faust(state):
    duty = _duty(state, {TP("t-source-changes", 0), TP("t-revocations", 1), TP("app-__assignor-__leader", 0)})
    duty.pause_inputs()
    assert duty.app.consumer.paused == {TP("t-source-changes", 0), TP("t-revocations", 1)}


# Through the broker ------------------------------------------------------------------------------------------


async def _committed(w) -> dict[tuple[str, int], int]:
    offsets = GroupOffsets(w.bootstrap, w.settings.app_id)
    try:
        return await offsets.read({w.settings.topic(n): n for n in INPUT_TOPICS})
    finally:
        await offsets.close()


def _offsets(health: dict) -> dict[tuple[str, int], int]:
    return {(t, int(p)): o for t, parts in health["applied_offsets"].items() for p, o in parts.items() if o}


async def test_the_group_offsets_follow_what_was_published_and_a_kill_9_loses_nothing(worker, tmp_path):
    """Faust delivers no input event (the router and the replica read them); what a killed worker left
    unpublished is published by the next owner."""
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))  # applied: the offsets below are whole
    applied = _offsets(await worker.get("/healthz"))

    async def committed(w, offsets):
        return await _committed(w) == offsets

    await eventually(lambda: committed(worker, applied), what="the group's offsets at what was applied")
    health = await worker.get("/healthz")
    assert health["inputs_from_faust"] == 0 and health["routing"]["routed"] > 0
    assert {(t, int(p)): o for t, parts in health["duty_committed"].items() for p, o in parts.items()} == applied

    peer = await start_peer(worker, tmp_path / "peer")
    try:
        async def split():
            a, b = (await worker.get("/healthz"))["duty"], (await peer.get("/healthz"))["duty"]
            return a.get(SC) and b.get(SC)
        await eventually(split, what="both workers holding input partitions")
        # Frozen, the worker publishes and commits nothing: bad events land on every partition, then it is killed.
        worker.proc.send_signal(signal.SIGSTOP)
        bad = [("source-changes", f"bad-{i}".encode(), b"{not json") for i in range(8)]
        await worker.publish(bad)
        worker.kill()
        letters = await peer.records("dead-letters", lambda rs: {r["_key"] for r in rs} >= {k for _, k, _ in bad},
                                     timeout=60)
        assert all(r["error_class"] == "malformed_json" for r in letters if r["_key"].startswith(b"bad-"))
        health = await peer.get("/healthz")  # its letters published: every bad event applied
        assert all(health["applied_offsets"][SC][str(p)] > applied.get((SC, p), 0) for p in (0, 1))
        await eventually(lambda: committed(peer, _offsets(health)), what="the group's offsets past the bad events")
        assert (await peer.get("/healthz"))["outbox"] == 0
    finally:
        for w in (worker, peer):
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
        peer.stop()


async def test_a_worker_blocked_on_reset_topics_commits_none_of_its_old_offsets(worker, tmp_path):
    """Offsets of the old topics committed to the new ones would make `--rebase` leave events below them unpublished."""
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    assert _offsets(await worker.get("/healthz"))
    worker.stop()
    with EmbeddedBroker() as other:  # the same cluster address coming back empty
        env = dict(worker.env, KAFKA_BOOTSTRAP_SERVERS=other.bootstrap_servers)
        settings = Settings.from_env(env)
        log_path = tmp_path / "reset.log"
        proc = _spawn(env, log_path)
        try:
            await _wait_health(worker.url, proc, log_path, "reset", auth_header(env))
            blocked = WorkerProcess(settings, other.bootstrap_servers, worker.url, proc, log_path, worker.http, env)

            async def assigned():
                return (await blocked.get("/healthz"))["duty"].get(SC)
            await eventually(assigned, what="the blocked worker holding input partitions")
            await asyncio.sleep(3)  # commits run every second: give a wrong one its chance
            assert (await blocked.get("/healthz"))["duty_committed"] == {}
            assert await _committed(blocked) == {}
        finally:
            _stop(proc)

        bad = [("source-changes", f"bad-{i}".encode(), b"{not json") for i in range(8)]
        await publish(settings, other.bootstrap_servers, bad)
        proc = _spawn(env, log_path, "--rebase")
        try:
            await _wait_health(worker.url, proc, log_path, "ok", auth_header(env))
            moved = WorkerProcess(settings, other.bootstrap_servers, worker.url, proc, log_path, worker.http, env)
            letters = await moved.records("dead-letters", lambda rs: {r["_key"] for r in rs} >= {k for _, k, _ in bad})
            assert all(r["error_class"] == "malformed_json" for r in letters)
        finally:
            _stop(proc)
