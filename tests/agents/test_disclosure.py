"""Nothing a principal may not use leaks: not into topics, receipts, logs or HTTP bodies."""

from __future__ import annotations

import base64

import orjson

from tests.catalog_double import SCENARIOS
from tests.conftest import ATLAS_REQUEST, freshest
from tests.events import resource, revoke_role

PAYMENT = orjson.loads((SCENARIOS / "payment-request.json").read_bytes())
RESTRICTED_TEXT = ["Restricted investigation note", "Investigation X9", "Sweep of the finance mailbox"]
RESTRICTED_IDS = ["investigation-X9", "mailbox-sweep-481"]


async def test_restricted_content_appears_nowhere(worker):
    fresh = freshest(await worker.load("atlas.jsonl"), await worker.load("payment.jsonl"))
    bodies = [await worker.select(ATLAS_REQUEST, fresh), await worker.select(PAYMENT, fresh),
              await worker.select(dict(ATLAS_REQUEST, principal="omar"), fresh)]
    fresh = await worker.publish_events(resource("approved-waiver-W2"), revoke_role("maya", "credit_analyst"))
    bodies += [await worker.select(ATLAS_REQUEST, fresh), await worker.select(PAYMENT, fresh)]
    bodies.append(await worker.select(dict(ATLAS_REQUEST, entity="Nowhere"), expect=404))
    bodies.append(await worker.get("/healthz"))

    await worker.records("receipts", lambda rs: len(rs) >= 5)  # every compilation's receipt is out
    topics = {}
    for name in ("plan-invalidations", "plans", "receipts", "dead-letters"):
        topics[name] = await worker.everything(name)
    receipts = topics["receipts"]
    assert any(r["resource_id"] == "investigation-X9" and r["reason"] == "not_authorised"
               for receipt in receipts for r in receipt.get("rejected", []))  # auditors get the id and class

    published = orjson.dumps([{k: v for k, v in r.items() if k != "_key"} for rs in topics.values() for r in rs])
    letters = b"".join(base64.b64decode(r["original"]) for r in topics["dead-letters"])
    log = worker.log_path.read_bytes()
    http = orjson.dumps(bodies)
    for text in RESTRICTED_TEXT:
        for where, blob in (("topics", published), ("dead letters", letters), ("log", log), ("http", http)):
            assert text.encode() not in blob, f"{text!r} leaked into {where}"
    for rid in RESTRICTED_IDS:
        assert rid.encode() not in http, f"{rid} disclosed to a caller"
        assert rid.encode() not in orjson.dumps([{k: v for k, v in p.items() if k != "_key"} for p in topics["plans"]])
