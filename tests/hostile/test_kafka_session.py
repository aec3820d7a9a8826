"""Apache Kafka's 6 s session timeout and 0.75 s heartbeats (a worker's default on an external cluster): a kill -9
still loses nothing. Every other broker test runs at the embedded broker's 4 s and 0.5 s (`tests.conftest.launch`)."""

from __future__ import annotations

import pytest

from streams.settings import Settings, heartbeat_interval
from tests.conftest import ATLAS_REQUEST, eventually, freshest, launch, start_peer
from tests.events import revoke_role
from tests.hostile.test_two_workers import _health, _owner_of, _split

pytestmark = pytest.mark.timeout(150)


async def test_a_worker_killed_under_kafka_s_default_session_timeout_leaves_its_plans_to_the_survivor(broker, tmp_path):
    kafka = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers}).session_timeout
    assert kafka == 6.0 and heartbeat_interval(kafka) == 0.75
    async with launch(broker, tmp_path / "a", FRESHPLAN_SESSION_TIMEOUT=f"{kafka:g}") as first:
        fresh = freshest(await first.load("atlas.jsonl"))
        atlas = await first.select(ATLAS_REQUEST, fresh)
        peer = await start_peer(first, tmp_path / "b")  # inherits the environment: the same timeout
        assert first.settings.session_timeout == peer.settings.session_timeout == kafka
        try:
            await _split(first, peer)
            owner, survivor = await _owner_of(atlas["entity_id"], first, peer)
            if owner is peer:  # the plan moved with its partition: the one the kill must not lose is the peer's
                atlas = await peer.select(ATLAS_REQUEST, fresh)
            owner.kill()
            # Published while the owner is dead and the group has not noticed yet: its plan must still be announced.
            revoked = await survivor.publish_events(revoke_role("maya", "credit_analyst"))
            await survivor.records("plan-invalidations", lambda rs: atlas["plan_id"] in {r["plan_id"] for r in rs},
                                   timeout=60)

            async def owns_all():
                return (await _health(survivor))["owned_partitions"] == list(range(survivor.settings.partitions))
            await eventually(owns_all, what="the survivor owning every plan partition")
            served = await survivor.select(ATLAS_REQUEST, revoked)
            assert served["plan_id"] != atlas["plan_id"] and served["admitted"] == [], served
        finally:
            if peer.proc.poll() is None:
                peer.stop()
