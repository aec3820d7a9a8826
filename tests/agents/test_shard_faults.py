"""A gained entity partition when restoring it cannot be done whole, through the broker (see agents/shards/).

Each test ends with one worker gaining the partition a peer held, in three cases: `source-changes`
was reset and rebased (the restore is incomplete), it was reset and not rebased (the restore is
refused), and the lane cannot be read from its start (nothing moves until it can).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from schemas.plan_partition import plan_partition
from streams.broker import EmbeddedBroker
from streams.processes import end_process
from tests.agents.broker_relay import relayed_broker
from tests.agents.test_shards import ATLAS, BOREAL, BOREAL_REQUEST, _shard, _split
from tests.conftest import ATLAS_REQUEST, ROOT, WorkerProcess, eventually, freshest, launch, start_peer
from tests.events import resource

pytestmark = pytest.mark.timeout(240)

A_PART, B_PART = plan_partition(ATLAS, 2), plan_partition(BOREAL, 2)


def _spawn(env: dict, log_path, *args: str) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "agents.cli", "run", *args], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)


async def _health(w: WorkerProcess) -> dict | None:
    """/healthz of a worker that may still be starting (or refusing): None until it answers 200."""
    assert w.proc.poll() is None, w.log_path.read_text()[-4000:]
    try:
        async with w.http.get(f"{w.url}/healthz") as resp:
            return await resp.json() if resp.status == 200 else None
    except Exception:  # noqa: BLE001 - not listening yet
        return None


async def _respawn(w: WorkerProcess, *args: str) -> None:
    """Start `w` again with its (possibly changed) env; return once /healthz answers (/readyz may refuse)."""
    w.proc = _spawn(w.env, w.log_path, *args)
    await eventually(lambda: _health(w), what="the restarted worker answering /healthz")


async def _split_and_stop(a: WorkerProcess, tmp_path) -> tuple[WorkerProcess, str, dict]:
    """`a` and a peer split the partitions, then both stop, the Atlas owner first: its file holds Atlas's only.

    Returns the stopped Atlas owner, the token of what was published and its last shard figures.
    """
    token = freshest(await a.load("atlas.jsonl"),
                     await a.publish_events(resource("boreal-waiver-B1", entity=BOREAL),
                                            *[resource(f"fault-{e}-{i}", entity=e) for e in (ATLAS, BOREAL)
                                              for i in range(3)]))
    await a.select(ATLAS_REQUEST, token)
    peer = await start_peer(a, tmp_path / "peer")
    try:
        atlas_owner, boreal_owner = await _split(a, peer)
        for w in (atlas_owner, boreal_owner):
            assert (await w.select(BOREAL_REQUEST, token))["admitted"]
        held = await _shard(atlas_owner)
        assert held["partitions"]["plans"] == [A_PART], held
        atlas_owner.stop()

        async def alone():
            s = await _shard(boreal_owner)
            return s["partitions"]["plans"] == [0, 1] and not s["restoring"]
        await eventually(alone, what="the other worker holding both partitions")
    finally:
        for w in (peer, a):
            if w.proc.poll() is None:
                w.stop()
    return atlas_owner, token, held


async def _recreate(w: WorkerProcess, name: str) -> None:
    """Delete a topic and create it again, empty: an operator's reset of one input topic."""
    topic = w.settings.topic(name)
    admin = AIOKafkaAdminClient(bootstrap_servers=w.bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])

        async def gone():
            return topic not in await admin.list_topics()
        await eventually(gone, timeout=30, what=f"{topic} deleted")
        await admin.create_topics([NewTopic(topic, w.settings.partitions, 1)])
    finally:
        await admin.close()


async def test_a_restore_after_a_rebase_is_reported_incomplete(broker, tmp_path):
    async with launch(broker, tmp_path / "a") as a:
        atlas_owner, _, _ = await _split_and_stop(a, tmp_path)
        with EmbeddedBroker() as other:  # the cluster came back empty: every input topic starts again at 0
            atlas_owner.env = dict(atlas_owner.env, KAFKA_BOOTSTRAP_SERVERS=other.bootstrap_servers)
            atlas_owner.bootstrap = other.bootstrap_servers
            try:
                await _respawn(atlas_owner, "--rebase")

                async def both():
                    h = await _health(atlas_owner)
                    s = h and h["shard"]
                    return h if s and s["partitions"]["plans"] == [0, 1] and not s["restoring"] else None
                h = await eventually(both, what="the rebased worker holding both partitions")
                assert h["counters"].get("input_resets") == 1, h["counters"]
                # Boreal's history was on the old topics: what the restore read is not all of it.
                assert h["shard"]["incomplete"] == [B_PART], h["shard"]
                assert h["shard"]["last_restore"]["partitions"] == [B_PART], h["shard"]
                assert h["counters"].get("shard_restores_incomplete") == 1, h["counters"]
            finally:
                end_process(atlas_owner.proc, timeout=20)


async def test_a_restore_is_refused_while_source_changes_is_blocked(broker, tmp_path):
    async with launch(broker, tmp_path / "a") as a:
        atlas_owner, _, held = await _split_and_stop(a, tmp_path)
        await _recreate(atlas_owner, "source-changes")
        try:
            # An external broker and no --rebase: the reset topic is blocked, the others are applied.
            await _respawn(atlas_owner)

            async def retried():
                h = await _health(atlas_owner)
                return h if h and h["ownership_failures"] >= 2 else None
            h = await eventually(retried, what="the take-over refused and retried")
            assert "source-changes" in h["revocations"]["resets"], h["revocations"]
            s = h["shard"]
            # Nothing of Boreal's partition is held or owned: Atlas's shard is as the file kept it.
            assert s["partitions"]["plans"] == [A_PART] and not s["owned_partitions"], s
            assert s["by_partition"] == held["by_partition"] and s["incomplete"] == [], s
            for request in (BOREAL_REQUEST, ATLAS_REQUEST):
                refused = await atlas_owner.select(request, expect=503)
                assert refused["error"]["code"] == "input_reset", refused  # the whole topic is untrusted
            log = atlas_owner.log_path.read_text()
            assert "a shard cannot be restored from it" in log, log[-3000:]
            h = await _health(atlas_owner)  # still up, still retrying, nothing restored from the new topic
            assert h["shard"]["partitions"]["plans"] == [A_PART], h["shard"]
            assert h["counters"].get("shards_restored", 0) == 0, h["counters"]
        finally:
            end_process(atlas_owner.proc, timeout=20)



async def test_a_restore_whose_lane_cannot_be_read_moves_nothing_and_a_retry_restores_it_whole(tmp_path):
    # Both workers (the peer shares the first one's environment) give a lane read that cannot start up after 3 s.
    async with relayed_broker() as (relay, broker), launch(broker, tmp_path / "a",
                                                           FRESHPLAN_RESTORE_STALL_SECONDS="3") as a:
        token = freshest(await a.load("atlas.jsonl"),
                         await a.publish_events(*[resource(f"fault-{e}-{i}", entity=e) for e in (ATLAS, BOREAL)
                                                  for i in range(3)]))
        await a.select(ATLAS_REQUEST, token)
        whole = await _shard(a)  # alone: every partition's resources
        assert whole["by_partition"][str(B_PART)] >= 3, whole
        peer = await start_peer(a, tmp_path / "peer")
        try:
            atlas_owner, boreal_owner = await _split(a, peer)
            failures = (await atlas_owner.get("/healthz"))["ownership_failures"]
            # From here a read of the lanes from their start cannot reach the broker; nothing else is cut.
            relay.cut = atlas_owner.settings.topic("entity-changes").encode()
            # Off the loop: the relay runs on it, and the stopping worker leaves the group through it.
            await asyncio.to_thread(boreal_owner.stop)

            async def failed():
                h = await atlas_owner.get("/healthz")
                return h if h["ownership_failures"] > failures and relay.dropped else None
            h = await eventually(failed, timeout=60, what="the lane read failing on the cut")
            # Nothing moved: Boreal's partition is neither held, read nor owned, and none of its resources are here.
            s = h["shard"]
            assert s["partitions"]["plans"] == [A_PART] and s["owned_partitions"] == [A_PART], s
            assert set(s["by_partition"]) == {str(A_PART)} and s["incomplete"] == [], s
            assert h["routing"]["catching_up"] == [] and h["routing"]["lanes"] == [A_PART], h["routing"]
            refused = await atlas_owner.select(BOREAL_REQUEST, token, expect=503)  # never from a partial shard
            assert refused["error"]["code"] in ("shard_restoring", "owner_unavailable"), refused
            assert (await atlas_owner.select(ATLAS_REQUEST, token))["admitted"]
            relay.cut = None

            async def restored():
                s = await _shard(atlas_owner)
                return s if s["partitions"]["plans"] == [0, 1] and not s["restoring"] else None
            s = await eventually(restored, what="a later try restoring Boreal's partition")
            assert s["by_partition"] == whole["by_partition"] and s["resources"] == whole["resources"], s
            assert s["last_restore"]["partitions"] == [B_PART] and s["incomplete"] == [], s
            assert (await atlas_owner.select(BOREAL_REQUEST, token))["admitted"]
        finally:
            relay.cut = None
            for w in (peer, a):
                await asyncio.to_thread(w.stop)
