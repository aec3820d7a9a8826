"""Freshness tokens: signed, refused when unsigned or altered, and bound to one incarnation."""

from __future__ import annotations

import base64

import orjson
import pytest

from schemas.freshness import BadToken, FreshnessToken, decode_token, encode_token, read_token

KEY, OLD, OTHER = b"k" * 32, b"o" * 32, b"x" * 32
OFFSETS = {"revocations": {0: 3, 1: 9}, "source-changes": {0: 12}}


def test_a_signed_token_reads_back_with_any_accepted_key():
    token = encode_token(OFFSETS, "cluster-a", 2, key=KEY)
    assert read_token(token, [OLD, KEY]) == FreshnessToken("cluster-a", 2, OFFSETS)
    assert decode_token(token) == OFFSETS  # tools reading a token the service handed them
    with pytest.raises(BadToken) as refused:
        read_token(token, [OTHER])
    assert refused.value.code == "token_invalid" and "not signed by this service" in str(refused.value)
    with pytest.raises(BadToken):
        read_token(token, [])


def _payload(token: str) -> dict:
    raw = token.split(".")[1]
    return orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))


def test_unsigned_tampered_and_made_up_tokens_are_refused():
    good = encode_token(OFFSETS, "cluster-a", 2, key=KEY)
    doc = _payload(good)
    doc["o"]["revocations"]["0"] = 10**12  # far-future offsets under the real MAC
    body = "ft3." + base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")
    tampered = f"{body}.{good.rsplit('.', 1)[1]}"
    unsigned = "ft2." + good.split(".")[1]  # the format before tokens were signed
    for bad in (tampered, unsigned, body, good[:-1], good + "A", "ft3..", "ft3.", "yesterday", "", "ft3.é.x",
                "ft3." + "A" * 70_000):
        with pytest.raises(BadToken) as refused:
            read_token(bad, [KEY])
        assert refused.value.code == "token_invalid" and len(str(refused.value)) > 30, bad[:20]
    with pytest.raises(BadToken) as refused:
        read_token(unsigned, [KEY])
    assert "unsigned" in str(refused.value)
    with pytest.raises(BadToken):
        read_token(12, [KEY])


def test_same_incarnation_needs_the_cluster_and_the_epoch_when_the_token_names_one():
    worker = FreshnessToken("cluster-a", 2, OFFSETS)
    assert worker.same_incarnation("cluster-a", 2)
    assert not worker.same_incarnation("cluster-b", 2)  # another cluster
    assert not worker.same_incarnation("cluster-a", 3)  # another rebase epoch of the same cluster
    assert not worker.same_incarnation(None, 2)
    producer = FreshnessToken("cluster-a", None, OFFSETS)  # `freshplan load` knows no worker's epoch
    assert producer.same_incarnation("cluster-a", 0) and producer.same_incarnation("cluster-a", 7)
    assert not producer.same_incarnation("cluster-b", 0)
    unknown = FreshnessToken(None, None, OFFSETS)
    assert unknown.same_incarnation(None, 0) and not unknown.same_incarnation("cluster-a", 0)
