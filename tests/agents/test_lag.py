"""The guard's verdicts: revocations and policy versions both fail closed; resets and pauses refuse."""

from __future__ import annotations

import time

import pytest

from agents.lag import LagWatcher
from compiler.errors import AttestError
from state.store import Store

TOPICS = {t: t for t in ("source-changes", "policy-versions", "revocations", "clock")}


@pytest.fixture
def guard(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    watcher = LagWatcher(store, "unused:9092", TOPICS, bound_seconds=1.0)
    watcher._checked_at = time.monotonic()
    yield watcher
    store.close()


def _refusal(guard) -> str:
    with pytest.raises(AttestError) as caught:
        guard.check()
    assert caught.value.status == 503
    return caught.value.code


def test_unknown_until_checked(guard):
    guard._checked_at = None
    assert _refusal(guard) == "revocations_unknown"


def test_policy_versions_behind_the_bound_refuse(guard):
    guard.ends = {"policy-versions": {0: 2}}
    guard._started_at = guard._caught_up["policy-versions"] = time.monotonic() - 5
    assert _refusal(guard) == "policy_versions_behind"
    with guard.store.transaction():
        guard.store.save_offsets({("policy-versions", 0): 2})
    assert guard.check().state == "ok"


def test_revocations_behind_the_bound_refuse(guard):
    guard.ends = {"revocations": {1: 1}}
    guard._started_at = time.monotonic() - 5
    assert _refusal(guard) == "revocations_behind"


def test_a_reset_outranks_everything(guard):
    guard.paused.add("revocations")
    guard.blocked["source-changes"] = "cluster_changed"
    assert _refusal(guard) == "input_reset"


def test_paused_guarded_topics_refuse_and_others_degrade(guard):
    guard.paused.update({"clock", "source-changes"})
    assert guard.check().state == "ok" and guard.degraded() == ["source-changes", "clock"]
    guard.paused.add("policy-versions")
    assert _refusal(guard) == "input_paused"
