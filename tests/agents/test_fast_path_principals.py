"""Early announcements of principal changes: only what the writer would judge to matter, by what it last stored."""

from __future__ import annotations

import pytest

from tests.agents.test_fast_path import invalidations, raw, world  # noqa: F401 - the fixture
from tests.conftest import ATLAS_REQUEST
from tests.events import policy_version, principal

pytestmark = pytest.mark.timeout(60)

WHO = ATLAS_REQUEST["principal"]


async def test_a_change_of_roles_is_announced_before_it_is_applied(world):  # noqa: F811
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    message = raw(*principal(WHO, roles=("credit_analyst", "auditor")))
    assert fast.announce([message]) == 1
    await fast.settle()
    assert [(r["plan_id"], r["cause"]["dependency_key"]) for r in sent.records] == [(plan["plan_id"], f"principal:{WHO}")]
    assert fast.figures()["early_announcements_of_principal_changes"] == 1
    world["applier"].apply([message])
    assert query.plan_status(plan["plan_id"])["status"] == "invalidated"
    assert invalidations(state) == []  # acknowledged early: the writer left its record out


async def test_what_no_policy_reads_and_older_records_are_not_announced(world):  # noqa: F811
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    plan = query.select(ATLAS_REQUEST)
    unread = raw(*principal(WHO, phone="555-0100"))  # no policy text names it
    older = raw(*principal(WHO, roles=("auditor",), delegation_version=2))
    assert fast.announce([unread, older]) == 0
    await fast.settle()
    assert sent.records == []
    world["applier"].apply([unread, older])
    assert query.plan_status(plan["plan_id"])["status"] == "fresh"  # the writer judged them alike
    assert invalidations(state) == []


async def test_once_a_policy_version_is_stored_the_writer_judges_principal_changes(world):  # noqa: F811
    """The texts a change is judged by are those the writer stored with a principal record; a policy version
    makes them unknown until the next one."""
    state, fast, sent, query = world["state"], world["fast"], world["sent"], world["query"]
    world["applier"].apply([raw(*policy_version(2, "2026-01-01T00:00:00Z"))])
    plan = query.select(ATLAS_REQUEST)
    change = raw(*principal(WHO, roles=("credit_analyst", "auditor")))
    assert fast.announce([change]) == 0
    world["applier"].apply([change])
    assert query.plan_status(plan["plan_id"])["status"] == "invalidated"
    assert [r["cause"]["dependency_key"] for r in invalidations(state)] == [f"principal:{WHO}"]
    again = query.select(ATLAS_REQUEST)  # the writer stored a record with the texts: judged early again
    assert fast.announce([raw(*principal(WHO, roles=("credit_analyst",)))]) == 1
    await fast.settle()
    assert [r["plan_id"] for r in sent.records] == [again["plan_id"]]
