"""Routes' referral to owners: a plan unknown here is asked of the other owners, each once."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from agents.web.forward import FORWARDED_HEADER, owner_unavailable, retry_headers
from agents.web.peers import NotOwner
from agents.web.routes import _ask_other_owners, _forwarded

pytestmark = pytest.mark.timeout(30)


def _api(owners: dict[int, str | None], answers: dict[str, tuple[int, dict]], foreign: list[int]):
    asked: list[tuple[str, str, object]] = []

    async def forward(url, path, body, headers):
        asked.append((url, path, body))
        return answers[url]

    query = SimpleNamespace(peers=SimpleNamespace(foreign_partitions=lambda: foreign), selects=Counter())
    return SimpleNamespace(owner_url=owners.get, forward=forward, query=query, restoring=frozenset), asked


async def test_the_first_owner_that_knows_the_plan_answers():
    api, asked = _api({1: "http://b", 2: "http://c", 3: "http://b"},
                      {"http://b": (404, {}), "http://c": (200, {"status": "fresh"})}, [1, 2, 3])
    assert await _ask_other_owners(api, "/v1/plans/p", {}) == (200, {"status": "fresh"})
    assert [url for url, _, _ in asked] == ["http://b", "http://c"]  # each owner once
    assert all(path == "/v1/plans/p" and body is None for _, path, body in asked)


async def test_nobody_knows_it_or_someone_cannot_be_asked():
    api, _ = _api({1: "http://b"}, {"http://b": (404, {})}, [1])
    assert (await _ask_other_owners(api, "/v1/plans/p", {}))[0] == 404
    api, _ = _api({1: "http://b", 2: None}, {"http://b": (404, {})}, [1, 2])  # partition 2: rebalance
    status, doc = await _ask_other_owners(api, "/v1/plans/p", {})
    assert status == 503 and doc["error"]["code"] == "owner_unavailable"
    api, _ = _api({1: "http://b"}, {"http://b": owner_unavailable("cannot be reached")}, [1])
    assert (await _ask_other_owners(api, "/v1/plans/p", {}))[0] == 503
    api, asked = _api({}, {}, [])  # a lone worker owns every partition: nobody else to ask
    assert (await _ask_other_owners(api, "/v1/plans/p", {}))[0] == 404 and not asked


async def test_a_forwarded_request_is_never_forwarded_again():
    api, asked = _api({1: "http://b"}, {"http://b": (200, {})}, [1])
    status, doc = await _forwarded(api, NotOwner("E", 1), None, {FORWARDED_HEADER: "1"}, "/v1/plans/p")
    assert status == 503 and doc["error"]["code"] == "owner_unavailable" and not asked
    assert await _forwarded(api, NotOwner("E", 1), None, {}, "/v1/plans/p") == (200, {})
    assert asked == [("http://b", "/v1/plans/p", None)]


async def test_a_partition_being_restored_here_is_refused_not_forwarded():
    api, asked = _api({1: "http://self"}, {"http://self": (200, {})}, [1])
    api.restoring = lambda: frozenset({1})
    status, doc = await _forwarded(api, NotOwner("E", 1), {"entity": "E"}, {})
    assert status == 503 and doc["error"]["code"] == "shard_restoring" and not asked
    assert retry_headers(status, doc) == {"Retry-After": "1"}
