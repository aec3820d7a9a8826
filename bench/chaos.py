"""`freshplan chaos`: the fault catalogue against live workers on the embedded broker, as a table."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import orjson

from agents.cli.loader import read_scenario
from agents.web.token_keys import TokenKeys
from bench.harness import ROOT, BenchWorker, _ready, start_worker
from streams.admin import producer
from schemas.freshness import encode_token, read_token
from streams.broker import EmbeddedBroker

SCENARIOS = ROOT / "scenarios"
ATLAS = orjson.loads((SCENARIOS / "atlas-request.json").read_bytes())
T0 = "2026-08-30T09:00:00Z"


@dataclass(frozen=True)
class Outcome:
    """One row of the chaos table."""

    fault: str
    """What was done to the worker."""
    expected: str
    """What the freshness contract promises."""
    observed: str
    """What the worker did."""
    held: bool
    """Whether the promise held."""


def _event(n: str, **body) -> dict:
    return {"event_id": f"chaos-{n}", "schema_version": 1, "occurred_at": T0, **body}


def _revoke(n: str) -> tuple[str, bytes, bytes]:
    return ("revocations", b"maya", orjson.dumps(_event(n, principal="maya", revoke="role", value="credit_analyst",
                                                        effective_at=T0, issued_by="chaos")))


async def _post(worker: BenchWorker, body: bytes | dict) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()  # integers past 64 bits too
    async with worker.http.post(f"{worker.url}/v1/select", data=data,
                                headers={**worker.auth, "Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json()


async def _loaded(worker: BenchWorker) -> tuple[str, dict]:
    token = await worker.publish(read_scenario(SCENARIOS / "atlas.jsonl"))
    return token, await worker.select(ATLAS, token)


async def reset_broker(worker: BenchWorker, directory: Path) -> Outcome:
    """The worker's broker comes back empty (a new cluster); then an operator rebases."""
    await _loaded(worker)
    worker.stop()
    with EmbeddedBroker() as other:
        worker.env["KAFKA_BOOTSTRAP_SERVERS"] = worker.bootstrap = other.bootstrap_servers
        with open(worker.log_path, "ab") as log:
            worker.proc = subprocess.Popen([sys.executable, "-m", "agents.cli", "run"], env=worker.env, cwd=ROOT,
                                           stdout=log, stderr=subprocess.STDOUT)
        refused = None
        for _ in range(300):
            try:
                status, doc = await _post(worker, ATLAS)
                if status == 503 and doc["error"]["code"] == "input_reset":
                    refused = doc["error"]["code"]
                    break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        worker.stop()
        with open(worker.log_path, "ab") as log:
            worker.proc = subprocess.Popen([sys.executable, "-m", "agents.cli", "run", "--rebase"], env=worker.env,
                                           cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        await _ready(worker)
        token = await worker.publish([_revoke("reset")])
        after = await worker.select(ATLAS, token)
        worker.stop()
    held = refused == "input_reset" and after["admitted"] == []
    return Outcome("broker reset (new cluster), then `run --rebase`",
                   "503 input_reset until rebased; then a revocation below the old offsets applies",
                   f"{refused or 'served'}; after rebase {len(after['admitted'])} admitted", held)


async def oversized_plan(worker: BenchWorker, directory: Path) -> Outcome:
    """Three valid 400 KB updates make a plan larger than the producer may send."""
    await _loaded(worker)
    lines = [orjson.loads(line)["event"] for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()]
    bloated = [("source-changes", e["resource"]["id"].encode(), orjson.dumps(dict(
        e, event_id=f"chaos-big-{e['resource']['id']}",
        resource=dict(e["resource"], version=9, content="x" * 400_000))))
        for e in lines if e.get("resource", {}).get("id") in ("facility-F102", "workflow-E88", "policy-P3")]
    token = await worker.publish(bloated)
    plan = await worker.select(ATLAS, token)
    health = await worker.caught_up(token, timeout=60)
    alive = worker.proc.poll() is None
    return Outcome("plan larger than the broker accepts", "published compact; worker alive; outbox drains",
                   f"alive={alive}, outbox={health['outbox']}, compacted="
                   f"{health['counters'].get('outbound_compacted', 0)}, caller got {len(plan['admitted'])} items",
                   alive and health["outbox"] == 0 and health["counters"].get("outbound_compacted", 0) >= 1)


async def id_collision(worker: BenchWorker, directory: Path) -> Outcome:
    """A revocation reuses the event id of a source change."""
    await _loaded(worker)
    entity = ("source-changes", b"CHAOS-1", orjson.dumps(_event("2002", kind="entity", op="upsert",
                                                                  entity={"id": "CHAOS-1", "aliases": []})))
    token = await worker.publish([entity, _revoke("2002")])
    after = await worker.select(ATLAS, token)
    return Outcome("event id reused across topics", "the revocation applies (ids are scoped by topic)",
                   f"{len(after['admitted'])} admitted after the revocation", after["admitted"] == [])


async def poisoned_plans(worker: BenchWorker, directory: Path) -> Outcome:
    """Garbage and an overflowing request on the internal, compacted `plan-dependencies` topic."""
    _, plan = await _loaded(worker)
    prod = producer(worker.bootstrap, worker.settings.kafka.client_kwargs())
    await prod.start()
    try:
        bad = dict(plan, plan_id="pl-chaos", request=dict(plan["request"], decision_time="0001-01-01T00:00:00+14:00"))
        for value in (b"{not json", orjson.dumps({"plan_id": 7}), orjson.dumps(bad)):
            await prod.send_and_wait(worker.settings.topic("plan-dependencies"), value, key=b"pl-chaos")
    finally:
        await prod.stop()
    skipped = 0
    for _ in range(100):
        skipped = (await worker.health())["counters"].get("bad_internal_records.plan-dependencies", 0)
        if skipped >= 3:
            break
        await asyncio.sleep(0.1)
    worker.stop()
    await worker.restart()
    alive = worker.proc.poll() is None
    return Outcome("poisoned records on `plan-dependencies`", "skipped and counted, on every start; no crash",
                   f"{skipped} skipped, alive after restart={alive}", skipped == 3 and alive)


async def paused_policies(worker: BenchWorker, directory: Path) -> Outcome:
    """An operator pauses `policy-versions`."""
    await _loaded(worker)
    await worker.consumers("policy-versions", "pause")
    code = None
    for _ in range(50):
        status, doc = await _post(worker, ATLAS)
        if status == 503:
            code = doc["error"]["code"]
            break
        await asyncio.sleep(0.1)
    await worker.consumers("policy-versions", "resume")
    return Outcome("policy-versions paused", "503 input_paused (policies can take permissions away)",
                   str(code), code == "input_paused")


async def hostile_requests(worker: BenchWorker, directory: Path) -> Outcome:
    """Oversized, overflowing and malformed select bodies."""
    await _loaded(worker)
    bodies = [dict(ATLAS, query="q" * 1_000_000), dict(ATLAS, budget={"tokens": 2**64}),
              b'{"budget": {"tokens": NaN}}', b"[" * 100_000, dict(ATLAS, decision_time="0001-01-01T00:00:00+14:00")]
    statuses = [(await _post(worker, body))[0] for body in bodies]
    return Outcome("hostile select bodies (1 MB query, 2^64 budget, NaN, deep nesting, year 0)",
                   "a 4xx with a code each; worker alive", ", ".join(map(str, statuses)),
                   all(400 <= s < 500 for s in statuses) and worker.proc.poll() is None)


async def clock_jump(worker: BenchWorker, directory: Path) -> Outcome:
    """A tick two centuries ahead."""
    await _loaded(worker)
    before = (await worker.health())["now"]
    token = await worker.publish([("clock", None, orjson.dumps(_event("jump", now="2206-08-30T00:00:00Z")))])
    health = await worker.caught_up(token, timeout=60)
    jumps = health["counters"].get("dead_letters.clock_jump", 0)
    return Outcome("clock tick far in the future", "dead-lettered clock_jump; now unchanged",
                   f"{jumps} dead-lettered, now {health['now']} (was {before})", jumps >= 1 and health["now"] == before)


async def read_load(worker: BenchWorker, directory: Path) -> Outcome:
    """Hundreds of concurrent distinct selects."""
    await _loaded(worker)
    results = await asyncio.gather(*[_post(worker, dict(ATLAS, query=f"chaos {i}")) for i in range(400)])
    refused = sum(1 for status, _ in results if status != 200)
    return Outcome("400 concurrent distinct selects", "no refusal from a starved guard", f"{refused} refused",
                   refused == 0)


async def withheld_cause(worker: BenchWorker, directory: Path) -> Outcome:
    """A resource the principal may not use is deleted."""
    _, plan = await _loaded(worker)
    token = await worker.publish([("source-changes", b"investigation-X9", orjson.dumps(
        _event("del-x9", kind="resource", op="delete", resource={"id": "investigation-X9"})))])
    await worker.select(ATLAS, token)
    async with worker.http.get(f"{worker.url}/v1/plans/{plan['plan_id']}", headers=worker.auth) as resp:
        status = await resp.json()
    key = (status.get("cause") or {}).get("dependency_key")
    return Outcome("withheld resource deleted", "the cause says resource:withheld", str(key),
                   key == "resource:withheld")


async def revocation_order(worker: BenchWorker, directory: Path) -> Outcome:
    """A revocation read before an older principal upsert that still lists the role."""
    await _loaded(worker)
    revoke = _event("order-r", principal="maya", revoke="role", value="credit_analyst",
                    effective_at="2026-08-30T09:05:00Z", issued_by="chaos")
    maya = {"id": "maya", "roles": ["credit_analyst"], "attributes": {"unit": "corporate-credit"},
            "delegation_version": 4}
    older = _event("order-p", kind="principal", op="upsert", principal=maya)
    await worker.select(ATLAS, await worker.publish([("revocations", b"maya", orjson.dumps(revoke))]))
    after = await worker.select(ATLAS, await worker.publish([("source-changes", b"maya", orjson.dumps(older))]))
    return Outcome("revocation read before an older upsert at a higher version",
                   "the role stays revoked (the upsert was made before the revocation took effect)",
                   f"{len(after['admitted'])} admitted, {after['withheld']} withheld", after["admitted"] == [])


async def forged_token(worker: BenchWorker, directory: Path) -> Outcome:
    """Freshness tokens made up with the real cluster id and offsets no broker reached, unsigned or re-signed."""
    token, plan = await _loaded(worker)
    keys = TokenKeys(worker.settings.token_keys_path)
    keys.load()
    real = read_token(plan["freshness_token"], keys.accepted())
    far = {t: {p: o + 10**9 for p, o in parts.items()} for t, parts in real.offsets.items()}
    unsigned = "ft2." + plan["freshness_token"].split(".")[1]
    resigned = encode_token(far, real.cluster_id, real.epoch, key=b"chaos" * 8)
    started = time.monotonic()
    refused = await asyncio.gather(*[_post(worker, dict(ATLAS, at_least_as_fresh=t))
                                     for t in [unsigned, resigned] * 50])
    took = time.monotonic() - started
    codes = {doc.get("error", {}).get("code") for _, doc in refused}
    good = await worker.select(ATLAS, token)
    wait = worker.settings.freshness_wait
    # Each would have held its select for the whole wait before signing: all of them in seconds is "at once".
    held = codes == {"token_invalid"} and all(s == 400 for s, _ in refused) and took < min(wait / 2, 5.0)
    held = held and bool(good["plan_id"])
    return Outcome("100 forged freshness tokens (real cluster id, far-future offsets; unsigned or signed with "
                   "another key)", f"400 token_invalid at once (not held for the {wait:g} s freshness wait); a "
                   "served token still works", f"{', '.join(sorted(map(str, codes)))} in {took:.2f}s; served token "
                   f"{'works' if good['plan_id'] else 'refused'}", bool(held))


FAULTS: list[Callable[[BenchWorker, Path], Awaitable[Outcome]]] = [
    reset_broker, oversized_plan, id_collision, poisoned_plans, paused_policies, hostile_requests, clock_jump,
    read_load, withheld_cause, revocation_order, forged_token]


async def run_chaos(directory: Path, progress=print, only: list[str] | None = None) -> list[Outcome]:
    """Each fault against a fresh worker on a fresh embedded broker."""
    outcomes = []
    async with aiohttp.ClientSession() as http:
        for fault in FAULTS:
            if only and fault.__name__ not in only:
                continue
            started = time.monotonic()
            with EmbeddedBroker() as broker:
                worker = await start_worker(broker.bootstrap_servers, directory / fault.__name__, http)
                try:
                    outcome = await fault(worker, directory)
                except Exception as exc:  # noqa: BLE001 - a fault that breaks the harness is a row, not a crash
                    outcome = Outcome(fault.__doc__ or fault.__name__, "(see the fault)",
                                      f"{type(exc).__name__}: {exc}"[:200], False)
                finally:
                    worker.stop()
            progress(f"{'held  ' if outcome.held else 'BROKEN'} {outcome.fault} ({time.monotonic() - started:.0f}s)")
            outcomes.append(outcome)
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    """The outcomes as a Markdown table."""
    rows = ["| fault | expected | observed | held |", "|---|---|---|---|"]
    rows += [f"| {o.fault} | {o.expected} | {o.observed} | {'yes' if o.held else '**no**'} |" for o in outcomes]
    return "\n".join(rows)


def main(out: Path | None = None, only: list[str] | None = None) -> int:
    """Run the catalogue; print the table (and write it as JSON when `out` is given); 1 if any broke."""
    with tempfile.TemporaryDirectory(prefix="freshplan-chaos-") as tmp:
        outcomes = asyncio.run(run_chaos(Path(tmp), lambda line: print(line, file=sys.stderr, flush=True), only))
    print(table(outcomes))
    if out is not None:
        out.write_text(json.dumps([o.__dict__ for o in outcomes], indent=2))
    return 0 if all(o.held for o in outcomes) else 1
