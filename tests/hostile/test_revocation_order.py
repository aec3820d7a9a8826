"""Issue 27 through the broker: a revocation holds whichever topic is read first, live and after replay."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ATLAS_REQUEST, ROOT
from tests.events import envelope

# Version 4 was made at 09:00 and still lists the role; the role is revoked at 09:05 without a version.
UPSERT = ("source-changes", dict(envelope(kind="principal", op="upsert", principal={
    "id": "maya", "roles": ["credit_analyst"], "attributes": {"unit": "corporate-credit"}, "delegation_version": 4}),
    occurred_at="2026-08-30T09:00:00Z"))
REVOKE = ("revocations", dict(envelope(principal="maya", revoke="role", value="credit_analyst",
                                       effective_at="2026-08-30T09:05:00Z", issued_by="iam"),
                              occurred_at="2026-08-30T09:05:00Z"))
REGRANT = ("source-changes", dict(envelope(kind="principal", op="upsert", principal={
    "id": "maya", "roles": ["credit_analyst"], "attributes": {"unit": "corporate-credit"}, "delegation_version": 5}),
    occurred_at="2026-08-30T09:10:00Z"))


def _revoked(plan: dict) -> bool:
    return plan["admitted"] == [] and plan["withheld"] > 0


@pytest.mark.parametrize("order", [(REVOKE, UPSERT), (UPSERT, REVOKE)], ids=["revocation-first", "upsert-first"])
async def test_an_older_upsert_cannot_undo_a_revocation_in_either_order_nor_after_replay(worker, order):
    fresh = await worker.load("atlas.jsonl")
    assert (await worker.select(ATLAS_REQUEST, fresh))["admitted"]
    first, second = order
    fresh = await worker.publish_events(first)
    await worker.select(ATLAS_REQUEST, fresh)                  # the first is applied before the second is sent
    fresh = await worker.publish_events(second)
    assert _revoked(await worker.select(ATLAS_REQUEST, fresh))

    worker.stop()
    out = subprocess.run([sys.executable, "-m", "agents.cli", "replay", "--state-dir", str(worker.settings.state_dir)],
                         cwd=ROOT, env=worker.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["events"]["revocations"] == 1
    await worker.restart()
    assert _revoked(await worker.select(ATLAS_REQUEST))

    fresh = await worker.publish_events(REGRANT)               # a record made after the revocation re-grants
    assert (await worker.select(ATLAS_REQUEST, fresh))["admitted"]
