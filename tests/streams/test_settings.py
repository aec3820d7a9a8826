"""Settings come from the environment once and are injected; flags override them."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from streams.settings import Settings


def test_defaults_use_the_embedded_broker_and_a_local_state_dir():
    settings = Settings.from_env({})
    assert settings.bootstrap_servers is None
    assert settings.db_path == Path(".freshplan") / "freshplan.duckdb"
    assert settings.wall_clock is True and settings.topic("clock") == "clock"


def test_environment_and_overrides():
    env = {"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092", "FRESHPLAN_TOPIC_PREFIX": "t1-",
           "FRESHPLAN_PARTITIONS": "8", "FRESHPLAN_WALL_CLOCK": "off", "FRESHPLAN_FRESHNESS_WAIT": "2.5"}
    settings = Settings.from_env(env).with_overrides(web_port=7000, state_dir=None)
    assert settings.bootstrap_servers == "kafka:9092" and settings.partitions == 8
    assert settings.topic("plans") == "t1-plans" and settings.wall_clock is False
    assert settings.freshness_wait == 2.5 and settings.web_port == 7000
    assert settings.state_dir == Path(".freshplan")


def test_the_clock_jump_bound_is_an_iso_duration():
    assert Settings.from_env({}).max_clock_jump == timedelta(days=400)
    assert Settings.from_env({"FRESHPLAN_MAX_CLOCK_JUMP": "PT12H"}).max_clock_jump == timedelta(hours=12)


def test_caller_and_kafka_security_settings():
    env = {"FRESHPLAN_CALLERS_FILE": "/etc/freshplan/callers.json",
           "FRESHPLAN_ALLOWED_ORIGINS": "https://a.example, https://b.example",
           "FRESHPLAN_ALLOWED_HOSTS": "freshplan.internal,LOCALHOST", "FRESHPLAN_METRICS_PORT": "9100",
           "FRESHPLAN_TOKEN": "declared-secret-0001", "FRESHPLAN_JWT_ISSUER": "https://idp",
           "KAFKA_SECURITY_PROTOCOL": "sasl_ssl", "KAFKA_SASL_USERNAME": "freshplan",
           "KAFKA_SASL_PASSWORD": "pw-not-shown"}
    settings = Settings.from_env(env)
    assert settings.callers_file == Path("/etc/freshplan/callers.json") and settings.metrics_port == 9100
    assert settings.allowed_origins == ("https://a.example", "https://b.example")
    assert settings.hosts == {"freshplan.internal", "localhost"} and settings.jwt_principal_claim == "sub"
    assert settings.kafka.protocol == "SASL_SSL" and settings.kafka.sasl_username == "freshplan"
    assert "declared-secret-0001" not in repr(settings) and "pw-not-shown" not in repr(settings)
    assert Settings.from_env({"FRESHPLAN_WEB_HOST": "0.0.0.0"}).hosts == {"0.0.0.0", "localhost", "127.0.0.1",
                                                                          "[::1]", "::1"}


def test_retention_spans_are_iso_durations():
    assert Settings.from_env({}).plan_retention == timedelta(days=30)
    assert Settings.from_env({}).receipt_retention == timedelta(days=400)
    settings = Settings.from_env({"FRESHPLAN_PLAN_RETENTION": "PT12H", "FRESHPLAN_RECEIPT_RETENTION": "P2W"})
    assert settings.plan_retention == timedelta(hours=12) and settings.receipt_retention == timedelta(weeks=2)
    with pytest.raises(ValueError, match="ISO 8601 duration"):
        Settings.from_env({"FRESHPLAN_PLAN_RETENTION": "30 days"})


def test_a_restore_read_gives_up_after_at_least_a_second_without_progress():
    assert Settings.from_env({}).restore_stall_seconds == 15.0
    assert Settings.from_env({"FRESHPLAN_RESTORE_STALL_SECONDS": "3"}).restore_stall_seconds == 3.0
    assert Settings.from_env({"FRESHPLAN_RESTORE_STALL_SECONDS": "0"}).restore_stall_seconds == 1.0  # never at once


def test_a_backlog_step_is_at_least_one_plan():
    assert Settings().backlog_step == 16
    assert Settings.from_env({"FRESHPLAN_BACKLOG_STEP": "4"}).backlog_step == 4
    assert Settings.from_env({"FRESHPLAN_BACKLOG_STEP": "0"}).backlog_step == 1  # a job of none would never drain
    assert Settings.from_env({"FRESHPLAN_BACKLOG_STEP": "-5"}).backlog_step == 1


def test_the_session_timeout_is_shorter_on_the_embedded_broker_and_kafka_s_floor_elsewhere():
    # The embedded broker holds each JoinGroup for half the session timeout: a kill -9's take-over costs ~1.5x it.
    assert Settings.from_env({}).session_timeout == 4.0
    assert Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092"}).session_timeout == 6.0  # Kafka refuses less
    assert Settings.from_env({"FRESHPLAN_SESSION_TIMEOUT": "8"}).session_timeout == 8.0
    both = {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "FRESHPLAN_SESSION_TIMEOUT": "10"}
    assert Settings.from_env(both).session_timeout == 10


def test_heartbeats_come_an_eighth_of_the_session_apart_so_a_dead_member_is_noticed_soon_after_it_expires():
    from streams.app import create_app, heartbeat_interval

    assert heartbeat_interval(4.0) == 0.5 and heartbeat_interval(6.0) == 0.75 and heartbeat_interval(45.0) == 1.0
    app = create_app(Settings.from_env({}), "127.0.0.1:9")
    assert app.conf.broker_session_timeout == 4.0 and app.conf.broker_heartbeat_interval == 0.5


@pytest.mark.parametrize("name, raw, says", [
    ("BATCH_SIZE", "abc", "is not a whole number"),
    ("BACKLOG_STEP", "a few", "is not a whole number"),
    ("SESSION_TIMEOUT", "six", "is not a number"),
    ("MAX_CLOCK_JUMP", "5m", "is not an ISO 8601 duration"),
    ("SESSION_TIMEOUT", "0.001", "is under 1 second"),
    ("SESSION_TIMEOUT", "nan", "is under 1 second"),
])
def test_a_setting_it_cannot_use_is_named_in_one_line_and_the_command_exits_2(name, raw, says, capsys, monkeypatch):
    from agents.cli.main import main
    from streams.settings import SettingsError

    with pytest.raises(SettingsError, match=f"FRESHPLAN_{name}=.*{says}"):
        Settings.from_env({f"FRESHPLAN_{name}": raw})
    monkeypatch.setenv(f"FRESHPLAN_{name}", raw)
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"freshplan: FRESHPLAN_{name}=") and says in err and "Traceback" not in err
