"""Events/s of the apply path through the broker, with a raw aiokafka consumer as the ceiling.

Run: .venv/bin/python bench/apply_throughput.py [--events N] [--plans P]
Publishes N resource changes (1 in 10 touches an entity that has a stored plan) to a fresh
worker on the embedded broker, and reports the time until the worker has applied them all,
next to a bare aiokafka consumer reading the same events in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.loader import publish  # noqa: E402
from streams.broker import EmbeddedBroker, free_port  # noqa: E402
from streams.settings import Settings  # noqa: E402

CREDIT = {"allowed_roles": ["credit_analyst"], "allowed_purposes": ["annual_credit_review"]}


def event(i: int, entity: str) -> tuple[str, bytes, bytes]:
    body = {"event_id": f"b-{i}", "schema_version": 1, "occurred_at": "2026-08-30T00:00:00Z",
            "kind": "resource", "op": "upsert",
            "resource": {"id": f"r-{i % 5000}", "version": i, "entity": entity, "tokens": 50,
                         "evidence_class": "facility_record", "supports": ["facility_limit"],
                         "valid_from": "2025-01-01T00:00:00Z", "attributes": CREDIT,
                         "content": f"record {i}"}}
    return "source-changes", f"r-{i % 5000}".encode(), orjson.dumps(body)


async def raw_ceiling(bootstrap: str, settings: Settings, n: int) -> float:
    consumer = AIOKafkaConsumer(settings.topic("source-changes"), bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest", group_id=f"ceiling-{uuid.uuid4().hex[:6]}")
    await consumer.start()
    start, seen = time.perf_counter(), 0
    try:
        while seen < n:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            seen += sum(len(v) for v in batch.values())
        return time.perf_counter() - start
    finally:
        await consumer.stop()


async def main(n: int, plans: int) -> None:
    with EmbeddedBroker() as broker:
        tmp = tempfile.mkdtemp(prefix="fpbench-")
        tag = uuid.uuid4().hex[:6]
        port = free_port()
        env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers, FRESHPLAN_TOPIC_PREFIX=f"b{tag}-",
                   FRESHPLAN_APP_ID=f"bench-{tag}", FRESHPLAN_STATE_DIR=tmp, FRESHPLAN_WEB_PORT=str(port),
                   FRESHPLAN_WALL_CLOCK="0", FRESHPLAN_FRESHNESS_WAIT="600", FRESHPLAN_LOG_LEVEL="warning")
        settings = Settings.from_env(env)
        proc = subprocess.Popen([sys.executable, "-m", "agents.cli", "run"], env=env, cwd=ROOT,
                                stdout=open(os.path.join(tmp, "worker.log"), "wb"), stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as http:
                while True:
                    try:
                        async with http.get(f"{url}/healthz") as resp:
                            if resp.status == 200:
                                break
                    except aiohttp.ClientError:
                        await asyncio.sleep(0.2)
                setup = [("policy-versions", b"credit", orjson.dumps(_bundle()))]
                setup += [("source-changes", f"p{i}".encode(), orjson.dumps(
                    {"event_id": f"ent-{i}", "schema_version": 1, "occurred_at": "2026-08-30T00:00:00Z",
                     "kind": "entity", "op": "upsert", "entity": {"id": f"E{i}", "aliases": []}}))
                    for i in range(plans)]
                setup.append(("source-changes", b"maya", orjson.dumps(
                    {"event_id": "maya", "schema_version": 1, "occurred_at": "2026-08-30T00:00:00Z",
                     "kind": "principal", "op": "upsert", "principal": {"id": "maya", "roles": ["credit_analyst"]}})))
                token = await publish(settings, broker.bootstrap_servers, setup)
                for i in range(plans):
                    body = {"decision_type": "bench", "principal": "maya", "purpose": "annual_credit_review",
                            "entity": f"E{i}", "decision_time": "2026-08-30T00:00:00Z",
                            "budget": {"tokens": 500}, "at_least_as_fresh": token}
                    async with http.post(f"{url}/v1/select", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                records = [event(i, f"E{i % plans}" if i % 10 == 0 else f"X{i % 997}") for i in range(n)]
                t0 = time.perf_counter()
                token = await publish(settings, broker.bootstrap_servers, records)
                published = time.perf_counter() - t0
                async with http.post(f"{url}/v1/select", json=dict(body, at_least_as_fresh=token)) as resp:
                    assert resp.status == 200, await resp.text()
                applied = time.perf_counter() - t0
                async with http.get(f"{url}/healthz") as resp:
                    health = await resp.json()
            ceiling = await raw_ceiling(broker.bootstrap_servers, settings, n + len(setup) - 1)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            shutil.rmtree(tmp, ignore_errors=True)
    c = health["counters"]
    print(f"events={n} plans={plans} publish={published:.2f}s apply_end_to_end={applied:.2f}s "
          f"-> {n / applied:,.0f} events/s; raw aiokafka consumer {n / ceiling:,.0f} events/s "
          f"(ratio {ceiling / applied:.2%}); invalidations={c.get('invalidations', 0)} "
          f"unchanged_recompilations={c.get('unchanged_recompilations', 0)}")


def _bundle() -> dict:
    return {"event_id": "bundle", "schema_version": 1, "occurred_at": "2026-08-30T00:00:00Z",
            "bundle_id": "credit", "version": 1, "effective_at": "2026-01-01T00:00:00Z",
            "cedar": 'permit(principal, action == Action::"use", resource) when { resource has allowed_roles && '
                     'resource.allowed_roles.containsAny(principal.roles) };',
            "decision_types": {"bench": {"purposes": ["annual_credit_review"], "propositions": [
                {"id": "facility_limit", "accepted_classes": ["facility_record"]}]}}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--plans", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.plans))
