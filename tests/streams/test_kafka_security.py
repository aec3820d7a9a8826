"""KAFKA_* security settings: validated at start-up and given to every Kafka client the worker builds."""

from __future__ import annotations

import ast
import ssl
from pathlib import Path

import faust
import pytest

import agents.stream.lag
import agents.stream.plan_feed
import agents.cli.replay
import agents.stream.replica
import streams.admin
import streams.partitions
import streams.plan_cache
from agents.worker import build_worker
from streams.kafka_security import KafkaSecurity, KafkaSecurityError
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SASL_SSL = {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "KAFKA_SASL_USERNAME": "freshplan", "KAFKA_SASL_PASSWORD": "s3cret-pw"}
CLIENTS = ("AIOKafkaConsumer", "AIOKafkaProducer", "AIOKafkaAdminClient")


def test_plaintext_by_default_adds_nothing():
    security = KafkaSecurity.from_env({})
    security.validate()
    assert security.client_kwargs() == {} and security.faust_credentials() is None


def test_sasl_ssl_becomes_aiokafka_kwargs_and_faust_credentials():
    security = KafkaSecurity.from_env(SASL_SSL)
    security.validate()
    kwargs = security.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL" and kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "freshplan" and kwargs["sasl_plain_password"] == "s3cret-pw"
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext) and kwargs["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    credentials = security.faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials) and credentials.protocol.value == "SASL_SSL"
    assert credentials.mechanism.value == "SCRAM-SHA-512" and credentials.ssl_context is not None
    assert "s3cret-pw" not in repr(security) and "s3cret-pw" not in repr(Settings.from_env(SASL_SSL))
    assert isinstance(KafkaSecurity(protocol="SSL").faust_credentials(), faust.SSLCredentials)


@pytest.mark.parametrize("env, named", [
    ({"KAFKA_SECURITY_PROTOCOL": "SASL_TLS"}, "KAFKA_SECURITY_PROTOCOL"),
    (dict(SASL_SSL, KAFKA_SASL_MECHANISM="GSSAPI"), "KAFKA_SASL_MECHANISM"),
    (dict(SASL_SSL, KAFKA_SASL_PASSWORD=""), "KAFKA_SASL_PASSWORD"),
    ({"KAFKA_SASL_USERNAME": "x"}, "KAFKA_SECURITY_PROTOCOL"),
    ({"KAFKA_SSL_CAFILE": "/ca.pem"}, "KAFKA_SECURITY_PROTOCOL"),
    (dict(SASL_SSL, KAFKA_SSL_CERTFILE="/c.pem"), "KAFKA_SSL_KEYFILE"),
    (dict(SASL_SSL, KAFKA_SSL_CAFILE="/nonexistent/ca.pem"), "KAFKA_SSL_CAFILE"),
])
def test_settings_that_cannot_work_stop_start_up_by_name(env, named):
    with pytest.raises(KafkaSecurityError, match=named) as caught:
        KafkaSecurity.from_env(env).validate()
    assert "s3cret-pw" not in str(caught.value)


def test_every_kafka_client_in_the_code_takes_the_security_kwargs():
    """Static: each aiokafka constructor call in the worker's code spreads the security kwargs (**...)."""
    calls = []
    for path in sorted((ROOT / "agents").rglob("*.py")) + sorted((ROOT / "streams").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in CLIENTS:
                calls.append((path.name, node.lineno, any(k.arg is None for k in node.keywords)))
    assert len(calls) >= 8, calls  # replica, lag, plan_feed, replay, admin x3, plan_cache
    # The embedded broker's readiness probe talks to the local PLAINTEXT broker it started itself.
    assert [c for c in calls if not c[2] and c[0] != "broker.py"] == []


class Built(Exception):
    """Raised by a recording client constructor, so nothing connects."""


def recorder(seen: list):
    def construct(*args, **kwargs):
        seen.append(kwargs)
        raise Built()
    return construct


async def test_every_client_the_worker_builds_receives_the_settings(tmp_path, monkeypatch):
    settings = Settings.from_env(dict(SASL_SSL, FRESHPLAN_STATE_DIR=str(tmp_path)))
    seen: list[dict] = []
    for module in (agents.stream.replica, agents.stream.lag, agents.stream.plan_feed, agents.cli.replay, streams.admin,
                   streams.plan_cache, streams.partitions):
        for name in CLIENTS:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, recorder(seen))
    worker = build_worker(settings, "kafka.example:9093")
    try:
        assert isinstance(worker.app.conf.broker_credentials, faust.SASLCredentials)
        attempts = [worker.replica.run(), worker.guard._ensure_consumer(), worker.plan_feed.run(),
                    streams.admin.ensure_topics(settings, "kafka.example:9093"),
                    streams.admin.GroupOffsets("kafka.example:9093", "g", settings.kafka.client_kwargs()).read({}),
                    agents.cli.replay.read_all("kafka.example:9093", "t", None, kafka=settings.kafka.client_kwargs()),
                    streams.plan_cache.PlanCache("kafka.example:9093", group_id="g", path=tmp_path / "c.db",
                                                 kafka=settings.kafka.client_kwargs()).start()]
        for attempt in attempts:
            with pytest.raises(Built):
                await attempt
        with pytest.raises(Built):
            streams.admin.producer("kafka.example:9093", settings.kafka.client_kwargs())
    finally:
        worker.close()
    assert len(seen) == 8
    for kwargs in seen:
        assert kwargs["security_protocol"] == "SASL_SSL" and kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
        assert kwargs["sasl_plain_username"] == "freshplan" and isinstance(kwargs["ssl_context"], ssl.SSLContext)
