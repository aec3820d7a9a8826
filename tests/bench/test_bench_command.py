"""`freshplan bench` runs its workers with the session timeout the service would use on the chosen broker."""

from __future__ import annotations

import argparse

import pytest


def _ran_with(monkeypatch, tmp_path, env: dict[str, str], quick: bool):
    import bench.suite
    from agents.cli.main import cmd_bench

    for name in ("KAFKA_BOOTSTRAP_SERVERS", "FRESHPLAN_SESSION_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen = {}

    def run(options, out, bootstrap=None):
        seen.update(options=options, bootstrap=bootstrap)
        return {"targets": []}

    monkeypatch.setattr(bench.suite, "run", run)
    args = argparse.Namespace(quick=quick, events=None, fanout_plans=None, restart_plans=None, seed=None, rates=None,
                              out=str(tmp_path))
    assert cmd_bench(args) == 0
    return seen["options"].session_timeout, seen["bootstrap"]


@pytest.mark.parametrize("quick", [False, True])
def test_the_embedded_broker_gets_its_4_s_and_apache_kafka_its_6_s_floor(monkeypatch, tmp_path, quick):
    assert _ran_with(monkeypatch, tmp_path, {}, quick) == (4.0, None)
    # Apache Kafka refuses a session timeout under 6 s by default: every worker would fail to join.
    assert _ran_with(monkeypatch, tmp_path, {"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092"}, quick) == (6.0, "kafka:9092")
    assert _ran_with(monkeypatch, tmp_path, {"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092",
                                             "FRESHPLAN_SESSION_TIMEOUT": "10"}, quick) == (10.0, "kafka:9092")
