"""`freshplan cdc demo`: Postgres, Debezium and a worker on the embedded broker; a row update invalidates a plan."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
TABLE = """CREATE SCHEMA kb; CREATE TABLE kb.documents (
  doc_id text PRIMARY KEY, rev int NOT NULL, customer_id text NOT NULL, title text, body text,
  token_count int NOT NULL, doc_class text NOT NULL, claims text[], refutes text[],
  valid_from timestamp, valid_to timestamptz, source_system text, sensitivity text, acl jsonb);
INSERT INTO kb.documents VALUES ('approved-waiver-W2', 1, 'ATLAS-IN-01', 'Waiver W2',
  'Waiver W2 approved by the credit committee.', 100, 'approved_waiver', '{waiver_valid}', '{}',
  '2026-08-29 00:00', '2026-09-30 23:59:59+00', 'credit-committee', 'internal',
  '{"allowed_roles": ["credit_analyst"], "allowed_purposes": ["annual_credit_review"]}')"""
UPDATE = "UPDATE kb.documents SET rev = 2, valid_to = '2026-08-29 12:00+00' WHERE doc_id = 'approved-waiver-W2'"
MAPPING = {"tables": {"kb.documents": {"kind": "resource", "fields": {
    "id": "doc_id", "version": "rev", "entity": "customer_id", "title": "title", "content": "body",
    "tokens": "token_count", "evidence_class": "doc_class", "supports": "claims", "contradicts": "refutes",
    "valid_from": "valid_from", "valid_to": "valid_to", "provenance_group": "source_system",
    "sensitivity": "sensitivity", "attributes": "acl"}}}}


def _say(text: str) -> None:
    print(text, flush=True)


async def _http(url: str, token: str, path: str, body: dict | None = None, timeout: float = 60.0) -> dict:
    import aiohttp

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        deadline = time.monotonic() + timeout
        while True:
            try:
                call = http.post(f"{url}{path}", json=body) if body is not None else http.get(f"{url}{path}")
                async with call as resp:
                    if resp.status == 200:
                        return await resp.json()
                    problem = await resp.text()
            except aiohttp.ClientError as exc:
                problem = str(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path}: {problem}")
            await asyncio.sleep(0.2)


async def _demo(work: Path) -> int:
    from agents.cli import cdc_local
    from agents.cli.loader import publish, read_scenario
    from streams.broker import EmbeddedBroker, free_port
    from streams.settings import Settings

    request = json.loads((SCENARIOS / "atlas-request.json").read_text())
    with EmbeddedBroker() as broker:
        pg = cdc_local.LocalPostgres().start()
        worker = None
        engine = None
        try:
            pg.execute(TABLE)
            _say(f"1. Postgres on 127.0.0.1:{pg.port}: table kb.documents with the waiver approved-waiver-W2")
            (work / "mapping.json").write_text(json.dumps(MAPPING))
            port, token = free_port(), secrets.token_urlsafe(24)
            env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers, FRESHPLAN_WEB_PORT=str(port),
                       FRESHPLAN_STATE_DIR=str(work / "state"), FRESHPLAN_TOKEN=token, FRESHPLAN_WALL_CLOCK="0",
                       FRESHPLAN_CDC_MAPPING=str(work / "mapping.json"))
            with open(work / "worker.log", "ab") as log:
                worker = subprocess.Popen([sys.executable, "-m", "agents.cli", "run"], env=env, stdout=log,
                                          stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            await _http(url, token, "/readyz")
            settings = Settings.from_env(env)
            await publish(settings, broker.bootstrap_servers, read_scenario(SCENARIOS / "atlas.jsonl"))
            _say(f"2. worker on {url} (log: {work / 'worker.log'}), Atlas policy and evidence loaded")
            props = cdc_local.connector_properties(pg, "demo", "kb.documents", work / "offsets.dat",
                                                   settings.topic("source-changes"))
            engine = cdc_local.Debezium(props, broker.bootstrap_servers).start()
            engine.wait_for(lambda sent: any(v and b'"op":"r"' in v for _, _, v in sent), 90, "the snapshot")
            _say("3. Debezium snapshotted kb.documents into source-changes")
            first = await _until(url, token, request, "supported")
            _say(f"4. plan {first['plan_id']}: waiver_valid {_waiver(first)} by approved-waiver-W2")
            pg.execute(UPDATE)
            _say(f"5. {UPDATE}")
            second = await _until(url, token, request, "unknown")
            status = await _http(url, token, f"/v1/plans/{first['plan_id']}")
            _say(f"6. plan {first['plan_id']} is {status['status']} ({status['reason']}, cause "
                 f"{status['cause']['event_id']})")
            _say(f"7. new plan {second['plan_id']}: waiver_valid {_waiver(second)}")
            return 0 if status["status"] == "invalidated" and second["plan_id"] != first["plan_id"] else 1
        finally:
            if engine is not None:
                engine.stop()
            if worker is not None:
                worker.terminate()
                worker.wait(timeout=30)
            pg.stop()


def _waiver(plan: dict) -> str:
    return next(s["state"] for s in plan["slots"] if s["proposition"] == "waiver_valid")


async def _until(url: str, token: str, request: dict, state: str, timeout: float = 60.0) -> dict:
    """Select until the waiver slot reaches `state` (the change is on its way through Debezium and Kafka)."""
    deadline = time.monotonic() + timeout
    while True:
        plan = await _http(url, token, "/v1/select", request)
        if _waiver(plan) == state or time.monotonic() > deadline:
            return plan
        await asyncio.sleep(0.3)


def cmd_cdc_demo(args) -> int:
    """Start Postgres, Debezium and a worker on the embedded broker; show a plan, update a row, show the
    invalidation and the new plan. Needs Java 17 and the cdc extra."""
    from agents.cli import cdc_local

    if why := cdc_local.missing():
        print(f"freshplan cdc demo: {why}", file=sys.stderr)
        return 2
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="freshplan-cdc-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    code = asyncio.run(_demo(work))
    _exit_past_the_jvm(code)
    return code


def _exit_past_the_jvm(code: int) -> None:
    """End the process without Python's finalization once Debezium's JVM has run in it.

    The JVM is left running at exit (destroying it waits for threads a closed engine leaves behind, and
    the process hangs); its threads are then torn down by the C runtime's exit, and now and then one of
    them aborts the process ("FATAL: exception not rethrown", exit -6) after the demo has succeeded.
    Everything the demo started (broker, Postgres, worker) is stopped by now; output is flushed first.
    """
    jpype = sys.modules.get("jpype")
    if jpype is None or not jpype.isJVMStarted():
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
