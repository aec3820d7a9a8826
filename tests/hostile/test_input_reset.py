"""Finding 1: offsets recorded against another broker or topic incarnation never make a worker skip events."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import uuid

import aiohttp
import pytest

from agents.cli.loader import publish, read_scenario
from streams.broker import EmbeddedBroker, free_port
from streams.settings import Settings
from tests.conftest import ATLAS_REQUEST, ROOT, SCENARIOS, WorkerProcess, auth_header
from tests.events import revoke_role

pytestmark = pytest.mark.timeout(240)


def _spawn(env: dict, log_path, *args: str) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "agents.cli", "run", *args], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)


async def _wait_health(url: str, proc: subprocess.Popen, log_path, want: str, headers: dict,
                       timeout: float = 60.0) -> dict:
    """Poll /healthz (details need the secret) until the guard's state is `want` (ok, reset, ...)."""
    async with aiohttp.ClientSession(headers=headers) as http:
        deadline = asyncio.get_running_loop().time() + timeout
        health: dict = {}
        while asyncio.get_running_loop().time() < deadline:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            try:
                async with http.get(f"{url}/healthz") as resp:
                    if resp.status == 200:
                        health = await resp.json()
                        if health["revocations"]["state"] == want:
                            return health
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"guard never reached {want}: {health}\n{log_path.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _run_embedded(env: dict, tmp_path, port: int) -> tuple[subprocess.Popen, WorkerProcess]:
    """`freshplan run` with its own embedded broker; the broker address comes from run.json."""
    log_path = tmp_path / "worker.log"
    proc = _spawn(env, log_path)
    url = f"http://127.0.0.1:{port}"
    run_file = tmp_path / "state" / "run.json"
    for _ in range(600):
        assert proc.poll() is None, log_path.read_text()[-4000:]
        if run_file.exists():
            break
        await asyncio.sleep(0.1)
    await _wait_health(url, proc, log_path, "ok", auth_header(env))
    info = json.loads(run_file.read_text())
    settings = Settings.from_env(env)
    return proc, WorkerProcess(settings, info["bootstrap_servers"], url, proc, log_path, env=env)


async def test_restart_on_an_embedded_broker_applies_a_revocation_below_the_old_offsets(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update(FRESHPLAN_STATE_DIR=str(tmp_path / "state"), FRESHPLAN_WEB_PORT=str(port), FRESHPLAN_WALL_CLOCK="0",
               FRESHPLAN_PARTITIONS="2", FRESHPLAN_FRESHNESS_WAIT="10", FRESHPLAN_REVOCATION_LAG_BOUND="1",
               FRESHPLAN_TOKEN=secrets.token_urlsafe(32))
    proc, first = await _run_embedded(env, tmp_path, port)
    async with aiohttp.ClientSession(headers=auth_header(env)) as http:
        first.http = http
        try:
            loaded = await first.publish(read_scenario(SCENARIOS / "atlas.jsonl"))
            before = await first.select(ATLAS_REQUEST, loaded)
            assert len(before["admitted"]) == 3
        finally:
            _stop(proc)

        # Same state dir, new embedded broker: every topic starts again at offset 0, far below
        # the offsets recorded in DuckDB.
        proc, second = await _run_embedded(env, tmp_path, port)
        second.http = http
        try:
            assert second.bootstrap != first.bootstrap
            health = await second.get("/healthz")
            assert health["counters"].get("input_resets") == 1
            revoked = await second.publish_events(revoke_role("maya", "credit_analyst"))
            after = await second.select(ATLAS_REQUEST, revoked)
            assert after["admitted"] == [] and after["plan_id"] != before["plan_id"]
            # A token of the previous broker names offsets of topics that no longer exist.
            stale = await second.select(ATLAS_REQUEST, loaded, expect=409)
            assert stale["error"]["code"] == "token_other_incarnation"
            status = await second.get(f"/v1/plans/{before['plan_id']}")
            assert status["status"] == "invalidated"
        finally:
            _stop(proc)


async def test_a_reset_external_broker_is_refused_until_the_operator_rebases(worker, tmp_path):
    loaded = await worker.load("atlas.jsonl")
    before = await worker.select(ATLAS_REQUEST, loaded)
    assert len(before["admitted"]) == 3
    worker.stop()

    with EmbeddedBroker() as other:  # stands in for the same cluster address coming back empty
        env = dict(worker.env, KAFKA_BOOTSTRAP_SERVERS=other.bootstrap_servers)
        log_path = tmp_path / "reset.log"
        proc = _spawn(env, log_path)
        try:
            health = await _wait_health(worker.url, proc, log_path, "reset", auth_header(env))
            assert set(health["revocations"]["resets"]) >= {"revocations", "source-changes"}
            refused = await worker.select(ATLAS_REQUEST, expect=503)
            assert refused["error"]["code"] == "input_reset"
            assert "freshplan run --rebase" in refused["error"]["message"]
        finally:
            _stop(proc)

        settings = Settings.from_env(env)
        await publish(settings, other.bootstrap_servers, read_scenario(SCENARIOS / "atlas.jsonl"))
        proc = _spawn(env, log_path, "--rebase")
        try:
            await _wait_health(worker.url, proc, log_path, "ok", auth_header(env))
            moved = WorkerProcess(settings, other.bootstrap_servers, worker.url, proc, log_path, worker.http, env)
            revoked = await moved.publish_events(revoke_role("maya", "credit_analyst"))
            after = await moved.select(ATLAS_REQUEST, revoked)
            assert after["admitted"] == []
            assert (await moved.get("/healthz"))["counters"].get("input_resets") == 1
        finally:
            _stop(proc)


async def test_a_token_of_another_cluster_is_refused(worker):
    from tests.conftest import sign_token

    loaded = await worker.load("atlas.jsonl")
    await worker.select(ATLAS_REQUEST, loaded)
    forged = sign_token({"revocations": {0: 0}}, f"some-other-cluster-{uuid.uuid4().hex[:6]}")
    refused = await worker.select(ATLAS_REQUEST, forged, expect=409)
    assert refused["error"]["code"] == "token_other_incarnation"
