"""Through the broker: owner_url inside a worker agrees with both workers' duty, and a forwarded select is served."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from agents.web.forward import forward_select
from schemas.plan_partition import plan_partition
from streams.broker import free_port
from streams.settings import INPUT_TOPICS
from tests.conftest import eventually as _until, ATLAS_REQUEST, ROOT, WorkerProcess, _wait_http

pytestmark = pytest.mark.timeout(240)


async def _probe_peer(first: WorkerProcess, directory) -> tuple[WorkerProcess, object]:
    """A second worker on the first's topics and group that writes its `owner_url` answers to a file."""
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / "owners.json"
    env = dict(first.env, FRESHPLAN_STATE_DIR=str(directory / "state"), FRESHPLAN_WEB_PORT=str(port),
               FRESHPLAN_PROBE_FILE=str(probe))
    log_path = directory / "worker.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.agents.forward_probe"], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    peer = WorkerProcess(first.settings, first.bootstrap, url, proc, log_path, http=first.http, env=env)
    await _wait_http(url, proc, log_path)
    return peer, probe


async def test_owner_url_names_the_worker_whose_duty_holds_the_partition_and_it_answers(worker, tmp_path):
    fresh = await worker.load("atlas.jsonl")
    first = await worker.select(ATLAS_REQUEST, fresh)
    peer, probe = await _probe_peer(worker, tmp_path / "peer")
    try:
        partitions = worker.settings.partitions
        url_of = {worker.url: worker, peer.url: peer}

        async def agreed():
            duties = {url: (await w.get("/healthz"))["duty"] for url, w in url_of.items()}
            if not probe.exists() or not all(duties.values()):
                return None
            doc = orjson.loads(probe.read_bytes())
            expected = {t: {str(p): next((u for u, d in duties.items() if p in d.get(t, [])), None)
                            for p in range(partitions)} for t in INPUT_TOPICS}
            return doc if doc["owners"] == expected and None not in expected["source-changes"].values() else None

        doc = await _until(agreed, what="owner_url agreeing with both workers' duty")
        assert doc["canonical_url"].rstrip("/") == peer.url
        assert set(doc["owners"]["source-changes"].values()) == {worker.url, peer.url}

        # The owner of the Atlas entity's partition answers a select forwarded to it, for the caller.
        owner = doc["owners"]["source-changes"][str(plan_partition(first["entity_id"], partitions))]
        status, served = await forward_select(owner, dict(ATLAS_REQUEST, at_least_as_fresh=fresh), worker.auth, 30)
        assert status == 200, served
        assert served["plan_id"] == first["plan_id"] and served["served_by"] == owner
        status, refused = await forward_select(owner, ATLAS_REQUEST, {"Authorization": "Bearer wrong"}, 30)
        assert status == 401 and "plan_id" not in refused

        peer.kill()   # an owner that is gone is refused with a retry hint, never answered from elsewhere
        status, gone = await forward_select(peer.url, ATLAS_REQUEST, worker.auth, 5)
        assert status == 503 and gone["error"]["code"] == "owner_unavailable"
    finally:
        if peer.proc.poll() is None:
            peer.stop()
