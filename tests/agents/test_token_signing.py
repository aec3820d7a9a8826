"""Through the broker: freshness tokens are signed; forged or altered ones are refused at once; keys rotate."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from schemas.freshness import encode_token, read_token
from agents.web.token_keys import TokenKeys
from tests.conftest import ATLAS_REQUEST, ROOT, eventually, launch

pytestmark = pytest.mark.timeout(180)


async def _post(worker, token: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    async with worker.http.post(f"{worker.url}/v1/select", json=dict(ATLAS_REQUEST, at_least_as_fresh=token)) as resp:
        return resp.status, await resp.json(), time.monotonic() - started


def _tampered(token: str, offsets: dict) -> str:
    prefix, payload, mac = token.split(".")
    doc = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    doc["o"] = offsets
    return f"{prefix}.{base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip('=')}.{mac}"


async def test_forged_and_altered_tokens_are_refused_at_once_and_signed_ones_of_another_epoch_get_409(broker, tmp_path):
    # The key file is the worker's own default (token-keys.json in its state dir), made on its first start.
    async with launch(broker, tmp_path, FRESHPLAN_TOKEN_KEY_FILE="", FRESHPLAN_FRESHNESS_WAIT="10") as worker:
        path = worker.settings.token_keys_path
        assert path.parent == worker.settings.state_dir and oct(path.stat().st_mode & 0o777) == "0o600"
        keys = TokenKeys(path)
        keys.load()
        fresh = await worker.load("atlas.jsonl")
        good = await worker.select(ATLAS_REQUEST, fresh)
        served = read_token(good["freshness_token"], keys.accepted())  # the worker signs what it serves
        far = {t: {str(p): o + 10**9 for p, o in parts.items()} for t, parts in served.offsets.items()}
        future = {t: {int(p): o for p, o in parts.items()} for t, parts in far.items()}
        forged = {
            "unsigned (the old format), real cluster, far-future offsets":
                "ft2." + good["freshness_token"].split(".")[1],
            "signed with a key of the attacker's": encode_token(future, served.cluster_id, served.epoch,
                                                                 key=b"a" * 32),
            "the served token with far-future offsets under its MAC": _tampered(good["freshness_token"], far),
            "no MAC": good["freshness_token"].rsplit(".", 1)[0],
        }
        for what, token in forged.items():
            status, doc, took = await _post(worker, token)
            assert (status, doc["error"]["code"], doc["error"]["pass"]) == (400, "token_invalid", "attest"), (what, doc)
            assert took < 2.0, (what, took)  # not held for the 10 s freshness wait
            assert "plan_id" not in doc and token not in doc["error"]["message"]
        status, doc, _ = await _post(worker, encode_token(future, served.cluster_id, served.epoch,
                                                          key=keys.sign_with()))
        assert (status, doc["error"]["code"]) == (503, "not_fresh_enough")  # validly signed: it is waited for
        other_epoch = encode_token(served.offsets, served.cluster_id, served.epoch + 1, key=keys.sign_with())
        status, doc, took = await _post(worker, other_epoch)
        assert (status, doc["error"]["code"]) == (409, "token_other_incarnation") and took < 2.0, doc
        assert (await _post(worker, good["freshness_token"]))[0] == 200
        assert (await worker.get("/healthz"))["counters"]["refused.token_invalid"] == len(forged)


async def test_a_rotated_key_signs_soon_after_and_the_old_one_is_accepted_through_the_grace(broker, tmp_path):
    async with launch(broker, tmp_path, FRESHPLAN_TOKEN_KEY_FILE=str(tmp_path / "group-keys.json")) as worker:
        fresh = await worker.load("atlas.jsonl")
        old_token = (await worker.select(ATLAS_REQUEST, fresh))["freshness_token"]
        old = TokenKeys(worker.settings.token_keys_path)
        old.load()
        out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agents.cli", "tokens", "rotate",
                                                       "--grace", "4", "--sign-after", "2"],
                                      cwd=ROOT, env=worker.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "2 keys" in out.stdout, out
        assert not any(k.secret.hex() in out.stdout + out.stderr for k in old.keys)
        rotated = TokenKeys(worker.settings.token_keys_path)
        rotated.load()
        new = tuple(k for k in rotated.accepted() if k not in old.accepted())
        assert len(new) == 1

        async def signs_with_new():
            token = (await worker.select(ATLAS_REQUEST))["freshness_token"]
            try:
                read_token(token, new)
            except ValueError:
                return None
            return token

        new_token = await eventually(signs_with_new, timeout=30, what="the worker signing with the new key")
        assert (await _post(worker, old_token))[0] == 200  # within the grace

        async def old_refused():
            status, doc, _ = await _post(worker, old_token)
            return status == 400 and doc["error"]["code"] == "token_invalid"

        await eventually(old_refused, timeout=30, what="the old key retired after its grace")
        assert (await _post(worker, new_token))[0] == 200
        log = worker.log_path.read_text()
        assert "token key file reloaded" in log and not any(k.hex() in log for k in rotated.accepted())


async def test_workers_that_do_not_share_a_key_file_refuse_and_say_so(broker, tmp_path):
    from schemas.plan_partition import plan_partition
    from streams.broker import free_port
    from tests.conftest import WorkerProcess, _spawn, _wait_http, sign_token

    async with launch(broker, tmp_path / "a", FRESHPLAN_TOKEN_KEY_FILE=str(tmp_path / "a-keys.json")) as first:
        fresh = await first.load("atlas.jsonl")
        plan = await first.select(ATLAS_REQUEST, fresh)
        port = free_port()
        env = dict(first.env, FRESHPLAN_STATE_DIR=str(tmp_path / "b" / "state"), FRESHPLAN_WEB_PORT=str(port),
                   FRESHPLAN_TOKEN_KEY_FILE=str(tmp_path / "b-keys.json"))  # a mistake: its own key file
        (tmp_path / "b").mkdir()
        log_path = tmp_path / "b" / "worker.log"
        peer = WorkerProcess(first.settings, first.bootstrap, f"http://127.0.0.1:{port}", _spawn(env, log_path),
                             log_path, http=first.http, env=env)
        try:
            await _wait_http(peer.url, peer.proc, log_path)
            mine = plan_partition(plan["entity_id"], first.settings.partitions)

            async def owner_known():
                owned = [(w, (await w.get("/healthz")).get("owned_partitions")) for w in (first, peer)]
                if not all(parts for _, parts in owned) or sorted(sum((p for _, p in owned), [])) != [0, 1]:
                    return None
                return next(w for w, parts in owned if mine not in parts)

            other = await eventually(owner_known, what="both workers owning plan partitions")
            offsets = read_token(fresh, TokenKeys(first.settings.token_keys_path).ensure().accepted())
            token = sign_token(offsets.offsets, offsets.cluster_id,
                               key_file=Path(other.env["FRESHPLAN_TOKEN_KEY_FILE"]))  # the non-owner's own key
            async with other.http.post(f"{other.url}/v1/select",
                                       json=dict(ATLAS_REQUEST, at_least_as_fresh=token)) as resp:
                doc = await resp.json()
            assert resp.status == 400 and doc["error"]["code"] == "token_invalid", doc  # refused by the owner

            async def said():
                return "token_keys_not_shared" in other.log_path.read_text()
            await eventually(said, what="the forwarding worker logging that the keys are not shared")
        finally:
            peer.stop()
