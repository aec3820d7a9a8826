"""Two workers under attack: forwarding keeps every guarantee, an owner that is gone is refused, never stale."""

from __future__ import annotations

import asyncio
import contextlib
import io
import hashlib
import json
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import aiohttp
import orjson
import pytest

from agents.web.forward import FORWARDED_HEADER
from schemas.freshness import read_token
from schemas.plan_partition import plan_partition
from schemas.timefmt import format_instant
from streams.broker import EmbeddedBroker
from tests.conftest import (ATLAS_REQUEST, ROOT, WorkerProcess, _wait_http, accepted_keys, eventually as _until,
                            freshest, launch, sign_token, start_peer)
from tests.events import regrant, resource, revoke_role

pytestmark = pytest.mark.timeout(150)

BOREAL_REQUEST = dict(ATLAS_REQUEST, entity="Boreal", query="Can the Boreal facility continue under the waiver?")
"""Its plan lives in the other plan partition (Atlas: 1, Boreal: 0 of 2)."""
BOREAL_WAIVER = resource("boreal-waiver-B1", entity="BOREAL-UK-02")  # so that a revocation changes its plan too
SECRETS = {"desk": "desk-secret-000000001", "gateway": "gateway-secret-00001"}
HOST = "freshplan.test"  # the only name the workers answer to in the hostile test (FRESHPLAN_ALLOWED_HOSTS)


def _caller(cid: str, principals: list[str]) -> dict:
    return {"id": cid, "secret_sha256": hashlib.sha256(SECRETS[cid].encode()).hexdigest(),
            "principals": principals, "scopes": ["select", "plans", "status"]}


async def call(url: str, path: str, headers: dict, body=None, method: str = "POST", raw: io.BytesIO | None = None):
    """One request with exactly these headers: (status, JSON answer, response headers)."""
    async with aiohttp.ClientSession() as http, asyncio.timeout(40):
        kwargs = {"data": raw} if raw is not None else ({"json": body} if body is not None else {})
        async with http.request(method, f"{url}{path}", headers=headers, **kwargs) as resp:
            text = await resp.read()
            try:
                doc = orjson.loads(text)
            except orjson.JSONDecodeError:
                doc = {"text": text.decode(errors="replace")}
            return resp.status, doc, resp.headers


async def _health(w: WorkerProcess, headers: dict | None = None) -> dict:
    status, doc, _ = await call(w.url, "/healthz", headers or w.auth, method="GET")
    assert status in (200, 503), doc
    return doc


async def _split(a: WorkerProcess, b: WorkerProcess, headers: dict | None = None) -> None:
    async def split():
        x, y = (await _health(a, headers)).get("owned_partitions"), (await _health(b, headers)).get("owned_partitions")
        return x and y and sorted(x + y) == list(range(a.settings.partitions))
    await _until(split, what="both workers owning plan partitions")


async def _owner_of(entity_id: str, a: WorkerProcess, b: WorkerProcess, headers: dict | None = None):
    mine = plan_partition(entity_id, a.settings.partitions)
    if mine in (await _health(a, headers))["owned_partitions"]:
        return a, b
    return b, a


def _not_500(status: int, doc: dict) -> None:
    assert status < 500 or status == 503, (status, doc)


def _owner_unavailable(status: int, doc: dict, headers) -> None:
    # A survivor still restoring the dead owner's shard refuses alike (503, Retry-After), never a partial answer.
    assert status == 503 and doc["error"]["code"] in ("owner_unavailable", "shard_restoring"), (status, doc)
    assert int(headers["Retry-After"]) >= 1 and "plan_id" not in doc


async def test_forwarding_gives_a_hostile_caller_nothing_the_owner_would_refuse(broker, tmp_path):
    """Spoofed forwarding header, bad credentials, another principal, huge bodies, tokens: through a peer."""
    callers = tmp_path / "callers.json"
    callers.write_text(json.dumps({"callers": [_caller("desk", ["*"]), _caller("gateway", ["sam"])]}))
    desk = {"Authorization": f"Bearer {SECRETS['desk']}", "Host": HOST}
    gateway = {"Authorization": f"Bearer {SECRETS['gateway']}", "Host": HOST}
    async with launch(broker, tmp_path / "a", wait=False, FRESHPLAN_CALLERS_FILE=str(callers),
                      FRESHPLAN_ALLOWED_HOSTS=HOST, FRESHPLAN_FRESHNESS_WAIT="3") as first:
        await _ready(first)
        fresh = await first.load("atlas.jsonl")
        peer = await _peer(first, tmp_path / "b")
        try:
            await _split(first, peer, desk)
            status, plan, _ = await call(first.url, "/v1/select", desk, dict(ATLAS_REQUEST, at_least_as_fresh=fresh))
            assert status == 200, plan
            owner, other = await _owner_of(plan["entity_id"], first, peer, desk)

            # The operator restricted Host names: a forwarded select still reaches the owner and is served.
            status, via, _ = await call(other.url, "/v1/select", desk, dict(ATLAS_REQUEST, at_least_as_fresh=fresh))
            assert status == 200 and via["plan_id"] == plan["plan_id"], via
            # One key file for the group: each worker accepts the tokens the other signed.
            for url, token in ((owner.url, plan["freshness_token"]), (other.url, plan["freshness_token"]),
                               (owner.url, via["freshness_token"]), (other.url, via["freshness_token"])):
                status, doc, _ = await call(url, "/v1/select", desk, dict(ATLAS_REQUEST, at_least_as_fresh=token))
                assert status == 200, doc
            assert via["served_by"].rstrip("/").endswith(owner.url[-5:])

            # A spoofed forwarding header gets a non-owner to refuse (never to answer from its own state).
            status, doc, headers = await call(other.url, "/v1/select", {**desk, FORWARDED_HEADER: "1"}, ATLAS_REQUEST)
            _owner_unavailable(status, doc, headers)
            # At the owner the header is no pass: the credential is checked as for anyone.
            for bad in ({"Host": HOST}, {"Host": HOST, "Authorization": "Bearer not-a-secret"}):
                status, doc, _ = await call(owner.url, "/v1/select", {**bad, FORWARDED_HEADER: "1"}, ATLAS_REQUEST)
                assert status == 401 and doc["error"]["code"] == "unauthenticated" and "plan_id" not in doc
            status, doc, _ = await call(other.url, "/v1/select", {"Host": HOST, "Authorization": "Bearer nope"},
                                        ATLAS_REQUEST)
            assert status == 401 and "plan_id" not in doc

            # A caller allowed only `sam` reaches maya neither through the peer nor by claiming a forward.
            for url, extra in ((other.url, {}), (owner.url, {FORWARDED_HEADER: "1"})):
                status, doc, _ = await call(url, "/v1/select", {**gateway, **extra}, ATLAS_REQUEST)
                assert status == 403 and doc["error"]["code"] == "principal_not_allowed", doc
            status, doc, _ = await call(other.url, "/v1/select", gateway, dict(ATLAS_REQUEST, principal="sam"))
            _not_500(status, doc)
            assert status == 200 and doc["served_by"].rstrip("/").endswith(owner.url[-5:]), doc
            sams = doc["plan_id"]
            # maya's plan status is unknown to the sam-only caller on every path: at the owner, through the
            # peer (which forwards or asks the owners), and with a spoofed forwarding header; same body as an
            # id nobody issued. The desk reads it through the peer; the gateway reads sam's.
            nobody = "plan-" + "e" * 20
            _, unknown, _ = await call(other.url, f"/v1/plans/{nobody}", gateway, method="GET")
            assert unknown["error"]["code"] == "unknown_plan", unknown
            for url, extra in ((other.url, {}), (owner.url, {}), (owner.url, {FORWARDED_HEADER: "1"}),
                               (other.url, {FORWARDED_HEADER: "1"})):
                status, doc, _ = await call(url, f"/v1/plans/{plan['plan_id']}", {**gateway, **extra}, method="GET")
                assert status == 404 and json.loads(json.dumps(doc).replace(plan["plan_id"], nobody)) == unknown, doc
            for url in (other.url, owner.url):
                status, doc, _ = await call(url, f"/v1/plans/{plan['plan_id']}", desk, method="GET")
                assert status == 200 and doc["plan_id"] == plan["plan_id"], doc
                status, doc, _ = await call(url, f"/v1/plans/{sams}", gateway, method="GET")
                assert status == 200 and doc["plan_id"] == sams, doc

            # Huge bodies are refused where they arrive, with the service's error shape.
            huge = orjson.dumps(dict(ATLAS_REQUEST, query="x" * 3_000_000))
            status, doc, _ = await call(other.url, "/v1/select", {**desk, "Content-Type": "application/json"},
                                        raw=io.BytesIO(huge))
            assert 400 <= status < 500 and "code" in doc.get("error", {}), (status, doc)
            status, doc, _ = await call(other.url, "/v1/select", desk, dict(ATLAS_REQUEST, query="y" * 5000))
            assert status == 422 and "plan_id" not in doc, doc

            # at_least_as_fresh through forwarding: the owner's answer reflects the named revocation.
            revoked = await other.publish_events(revoke_role("maya", "credit_analyst"))
            status, doc, _ = await call(other.url, "/v1/select", desk,
                                        dict(ATLAS_REQUEST, at_least_as_fresh=freshest(fresh, revoked)))
            assert status == 200 and doc["admitted"] == [] and doc["plan_id"] != plan["plan_id"], doc
            token = read_token(revoked, accepted_keys())
            future = sign_token({t: {p: o + 1000 for p, o in ps.items()} for t, ps in token.offsets.items()},
                                token.cluster_id)
            status, doc, _ = await call(other.url, "/v1/select", desk, dict(ATLAS_REQUEST, at_least_as_fresh=future))
            assert status == 503 and doc["error"]["code"] == "not_fresh_enough", doc
            elsewhere = sign_token(token.offsets, "another-cluster")
            status, doc, _ = await call(other.url, "/v1/select", desk,
                                        dict(ATLAS_REQUEST, at_least_as_fresh=elsewhere))
            assert status == 409 and doc["error"]["code"] == "token_other_incarnation", doc
            for w in (first, peer):
                assert w.proc.poll() is None, w.log_path.read_text()[-3000:]
        finally:
            peer.stop()


async def _ready(w: WorkerProcess) -> None:
    """/readyz with the Host the hostile test's workers answer to."""
    async def ready():
        if w.proc.poll() is not None:
            raise AssertionError(w.log_path.read_text()[-3000:])
        with contextlib.suppress(aiohttp.ClientError):
            status, _, _ = await call(w.url, "/readyz", {"Host": HOST}, method="GET")
            return status == 200
    await _until(ready, what="the worker ready")


async def _peer(first: WorkerProcess, directory) -> WorkerProcess:
    """start_peer for workers that answer only to HOST (start_peer's readiness probe uses 127.0.0.1)."""
    from streams.broker import free_port
    from tests.conftest import _spawn
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    env = dict(first.env, FRESHPLAN_STATE_DIR=str(directory / "state"), FRESHPLAN_WEB_PORT=str(port))
    peer = WorkerProcess(first.settings, first.bootstrap, f"http://127.0.0.1:{port}",
                         _spawn(env, directory / "worker.log"), directory / "worker.log", http=first.http, env=env)
    first.peers.append(peer)
    await _ready(peer)
    return peer


async def test_an_owner_killed_while_forwarding_or_down_is_refused_then_the_survivor_answers(worker, tmp_path):
    """owner_unavailable with Retry-After while the owner is gone, never a 500 or a stale plan; then the survivor."""
    fresh = freshest(await worker.load("atlas.jsonl"), await worker.publish_events(BOREAL_WAIVER))
    atlas = await worker.select(ATLAS_REQUEST, fresh)
    boreal = await worker.select(BOREAL_REQUEST, fresh)
    assert boreal["admitted"], boreal  # a revocation of maya's role changes it
    peer = await start_peer(worker, tmp_path / "peer")
    try:
        await _split(worker, peer)
        owner, other = await _owner_of(atlas["entity_id"], worker, peer)

        # The worker that handed a partition back says nothing stale about its plans' status after a change.
        handed_back = boreal if owner is worker else atlas
        revoked = await other.publish_events(revoke_role("maya", "credit_analyst"))
        await other.records("plan-invalidations", lambda rs: {r["plan_id"] for r in rs} >= {atlas["plan_id"],
                                                                                           boreal["plan_id"]})
        for w in (worker, peer):
            status, doc, _ = await call(w.url, f"/v1/plans/{handed_back['plan_id']}", w.auth, method="GET")
            assert status == 200 and doc["status"] == "invalidated", (w.url, owner.url, status, doc)

        # A select in flight to a frozen owner, which is then killed: the caller is refused, not failed.
        owner.proc.send_signal(signal.SIGSTOP)
        in_flight = asyncio.create_task(call(other.url, "/v1/select", other.auth,
                                             dict(ATLAS_REQUEST, at_least_as_fresh=revoked)))
        await asyncio.sleep(1.0)  # the forward is waiting on the frozen owner (nothing to await from outside)
        assert not in_flight.done()
        owner.kill()
        status, doc, headers = await in_flight
        _owner_unavailable(status, doc, headers)

        # Until the group moves the partition: owner_unavailable; then the survivor answers, from fresh state.
        refused = 0
        while True:
            status, doc, headers = await call(other.url, "/v1/select", other.auth,
                                              dict(ATLAS_REQUEST, at_least_as_fresh=revoked))
            if status == 200:
                break
            _owner_unavailable(status, doc, headers)
            refused += 1
            await asyncio.sleep(0.5)
        assert refused >= 1
        assert doc["admitted"] == [] and doc["served_by"].rstrip("/").endswith(other.url[-5:]), doc
        assert doc["plan_id"] != atlas["plan_id"]
        assert (await _health(other))["owned_partitions"] == list(range(other.settings.partitions))
        status, receipt, _ = await call(other.url, f"/v1/receipts/{doc['receipt_id']}", other.auth, method="GET")
        # A plan taken over from plan-dependencies brings its receipt: its new owner can show what it serves.
        assert status == 200 and receipt["plan_id"] == doc["plan_id"], (status, receipt, doc["served_from"])
    finally:
        for w in (worker, peer):
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
        if peer.proc.poll() is None:
            peer.stop()


async def test_a_worker_restarted_on_old_state_announces_nothing_for_partitions_it_no_longer_owns(worker, tmp_path):
    """Its file still holds heads and index edges of every plan it once owned; the peer owns some of them now."""
    fresh = freshest(await worker.load("atlas.jsonl"), await worker.publish_events(BOREAL_WAIVER))
    plans = [await worker.select(r, fresh) for r in (ATLAS_REQUEST, BOREAL_REQUEST)]
    worker.stop()
    peer = await start_peer(worker, tmp_path / "peer")
    try:
        await _until(lambda: _owns(peer, [0, 1]), what="the peer owning every partition")
        revoked = await peer.publish_events(revoke_role("maya", "credit_analyst"))
        await peer.records("plan-invalidations", lambda rs: {r["plan_id"] for r in rs} >= {p["plan_id"] for p in plans})
        await worker.restart()
        await _split(worker, peer)
        owned = (await _health(worker))["owned_partitions"]
        [foreign] = [p for p in plans if plan_partition(p["entity_id"], 2) not in owned]
        before = (await _health(worker))["counters"].get("invalidations", 0)

        # maya's role comes back: both plans change again; each is announced by its owner alone.
        regranted = regrant("maya", 4)
        restored = await peer.publish_events(regranted)
        token = freshest(fresh, revoked, restored)
        answers, keys = {}, set()
        for w in (worker, peer):
            for request in (ATLAS_REQUEST, BOREAL_REQUEST):
                status, doc, _ = await call(w.url, "/v1/select", w.auth, dict(request, at_least_as_fresh=token))
                assert status == 200 and doc["admitted"], (w.url, doc)
                answers.setdefault(request["entity"], set()).add((doc["plan_id"], doc["served_by"].rstrip("/")))
                keys.add(doc["plan_key"])
        assert all(len(seen) == 1 for seen in answers.values()), answers  # one plan per entity, from its owner
        [(_, served)] = answers[{"ATLAS-IN-01": "Atlas", "BOREAL-UK-02": "Boreal"}[foreign["entity_id"]]]
        assert served.endswith(peer.url[-5:])
        await _until(lambda: _announced_all(peer, keys, regranted[1]["event_id"]),
                     what="both successors' predecessors announced")
        after = (await _health(worker))["counters"].get("invalidations", 0)
        assert after - before == 1, (before, after)  # its own plan only, never the peer's from a stale head
    finally:
        peer.stop()


async def _owns(w: WorkerProcess, partitions: list[int]) -> bool:
    return (await _health(w)).get("owned_partitions") == partitions


async def _announced_all(w: WorkerProcess, plan_keys: set[str], event_id: str) -> bool:
    """Every current plan's predecessor was announced invalidated by the event (before its successor existed)."""
    announced = {r["plan_key"] for r in await w.everything("plan-invalidations") if r["cause"]["event_id"] == event_id}
    return plan_keys <= announced


async def test_a_peer_joining_during_fan_outs_loses_no_announcement_and_leaves_nothing_stale(broker, tmp_path):
    """Fan-outs (announced first, successors compiled by the backlog) keep coming while the group rebalances."""
    requests = [dict(r, budget={"tokens": 700 + i}) for i in range(12) for r in (ATLAS_REQUEST, BOREAL_REQUEST)]
    async with launch(broker, tmp_path / "a", FRESHPLAN_EAGER_RECOMPILE_LIMIT="1") as first:
        tokens = [await first.load("atlas.jsonl"), await first.publish_events(BOREAL_WAIVER)]
        for request in requests:
            await first.select(request, freshest(*tokens))
        joining = asyncio.create_task(start_peer(first, tmp_path / "b"))
        wave = 0

        async def change() -> None:
            nonlocal wave
            wave += 1
            # Each revocation names the version it applies as of: an unversioned one takes whatever version
            # the applying worker holds, and a peer catching up reads the two topics in another order.
            event = revoke_role("maya", "credit_analyst", delegation_version=2 + wave) if wave % 2 else regrant(
                "maya", 3 + wave, at=format_instant(datetime(2026, 8, 30, 9, tzinfo=timezone.utc)
                                                    + timedelta(minutes=wave)))
            tokens.append(await first.publish_events(event))

        try:
            while not joining.done():
                await change()
                await asyncio.sleep(0.3)
            peer = joining.result()
            assert wave >= 2  # changes kept coming while the peer joined and the group rebalanced
        except BaseException:
            joining.cancel()
            raise
        try:
            while wave < 3 or wave % 2:  # a few after the join; the last one gives the role back
                await change()
            assert wave >= 4
            await _split(first, peer)
            token = freshest(*tokens)
            current: dict[str, str] = {}
            for request in requests:
                seen = set()
                for w in (first, peer):
                    status, doc, _ = await call(w.url, "/v1/select", w.auth, dict(request, at_least_as_fresh=token))
                    assert status == 200 and doc["admitted"], (w.url, status, doc)  # maya's role is back
                    seen.add(doc["plan_id"])
                    current[doc["plan_key"]] = doc["plan_id"]
                assert len(seen) == 1, seen

            async def nothing_unannounced() -> bool:
                published = [r for r in await first.everything("plans") if r["plan_key"] in current]
                invalidated = {r["plan_id"] for r in await first.everything("plan-invalidations")}
                stale = {r["plan_id"] for r in published if r["plan_id"] != current[r["plan_key"]]}
                return stale and stale <= invalidated
            await _until(nothing_unannounced, what="every superseded plan announced")
        finally:
            peer.stop()


async def test_both_workers_rebased_onto_a_reset_broker_serve_and_announce_nothing_stale(tmp_path):
    """The broker comes back empty (Tansu keeps topics in memory); both workers restart with --rebase."""
    with EmbeddedBroker() as old:
        async with launch(old, tmp_path / "a") as first:
            loaded = freshest(await first.load("atlas.jsonl"), await first.publish_events(BOREAL_WAIVER))
            plans = [await first.select(r, loaded) for r in (ATLAS_REQUEST, BOREAL_REQUEST)]
            peer = await start_peer(first, tmp_path / "b")
            await _split(first, peer)

            async def both_parked() -> bool:
                # What a worker never read from `plan-dependencies` it cannot know after the broker is gone. Each
                # keeps the records of the partitions it holds: each plan's are with the holder of its entity's.
                return sum([(await _health(w))["parked_plans"] for w in (first, peer)]) >= len(plans)
            await _until(both_parked, what="each plan's record parked by the worker holding its partition")
            peer.stop()
            first.stop()
            with EmbeddedBroker() as new:
                workers = [_rebased(w, new.bootstrap_servers) for w in (first, peer)]
                try:
                    for w in workers:
                        await _wait_http(w.url, w.proc, w.log_path)
                    fresh = freshest(await workers[0].load("atlas.jsonl"), await workers[0].publish_events(
                        BOREAL_WAIVER, revoke_role("maya", "credit_analyst")))
                    await _split(*workers)
                    for w in workers:
                        await _answers_from_the_new_incarnation(w, plans, fresh, loaded)
                finally:
                    for w in workers:
                        w.stop()


async def _answers_from_the_new_incarnation(w: WorkerProcess, plans: list[dict], fresh: str, old: str) -> None:
    for request, old_plan in zip((ATLAS_REQUEST, BOREAL_REQUEST), plans, strict=True):
        status, doc, _ = await call(w.url, "/v1/select", w.auth, dict(request, at_least_as_fresh=fresh))
        assert status == 200 and doc["admitted"] == [] and doc["plan_id"] != old_plan["plan_id"], doc
        status, doc, _ = await call(w.url, "/v1/select", w.auth, dict(request, at_least_as_fresh=old))
        assert status == 409 and doc["error"]["code"] == "token_other_incarnation", doc
        status, doc, _ = await call(w.url, f"/v1/plans/{old_plan['plan_id']}", w.auth, method="GET")
        assert status == 200 and doc["status"] == "invalidated", (w.url, doc)


def _rebased(w: WorkerProcess, bootstrap: str) -> WorkerProcess:
    """The same worker (state dir, port, group) started with --rebase against another broker."""
    env = dict(w.env, KAFKA_BOOTSTRAP_SERVERS=bootstrap)
    with open(w.log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "agents.cli", "run", "--rebase"], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
    return WorkerProcess(w.settings, bootstrap, w.url, proc, w.log_path, http=w.http, env=env)
