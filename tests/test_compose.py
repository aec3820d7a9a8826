"""docker-compose.yml and the Dockerfile can run a scaled cluster (no Docker engine here: a static check)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_the_worker_service_can_be_scaled():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    worker = compose["services"]["worker"]
    # A fixed container name or host port would make `--scale worker=3` fail on the second replica.
    assert "container_name" not in worker
    assert all(":" not in str(port) for port in worker.get("ports", []))
    env = worker["environment"]
    host = env["KAFKA_BOOTSTRAP_SERVERS"].split(":")[0]
    assert host in compose["services"] and worker["depends_on"][host]["condition"] == "service_healthy"
    assert int(env["FRESHPLAN_PARTITIONS"]) == 12   # `--scale worker=3` gets four entity partitions each
    assert compose["services"]["acls"]["environment"]["PARTITIONS"] == env["FRESHPLAN_PARTITIONS"]
    assert env["FRESHPLAN_STANDBY_REPLICAS"] == "1"  # a dead worker's partitions are already warm elsewhere
    state = "/var/lib/freshplan"
    assert state in worker["volumes"]  # anonymous: one state volume per replica
    assert all(v == state or v.endswith(":ro") for v in worker["volumes"])  # anything shared is read-only
    # One token key file for the group, made once by its own service, read-only in the workers.
    keys = compose["services"]["token-keys"]
    assert env["FRESHPLAN_TOKEN_KEY_FILE"] == keys["environment"]["FRESHPLAN_TOKEN_KEY_FILE"] == "/keys/token-keys.json"
    assert "token-keys:/keys:ro" in worker["volumes"] and "token-keys:/keys" in keys["volumes"]
    assert worker["depends_on"]["token-keys"]["condition"] == "service_completed_successfully"


def test_kafka_is_reached_over_sasl_ssl_and_acls_keep_writers_to_their_topics():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = compose["services"]["worker"]["environment"]
    assert env["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL" and env["KAFKA_SASL_USERNAME"] == "freshplan"
    assert env["KAFKA_SSL_CAFILE"] and env["KAFKA_SASL_PASSWORD"].startswith("${")  # never a literal
    assert env["FRESHPLAN_TOKEN"].startswith("${") and "worker" in env["FRESHPLAN_ALLOWED_HOSTS"]
    broker = (ROOT / "deploy" / "kafka" / "start-kafka.sh").read_text()
    assert "allow.everyone.if.no.acl.found=false" in broker and "listeners=SASL_SSL://:9094," in broker
    acls = (ROOT / "deploy" / "kafka" / "acls.sh").read_text()
    writers = {}
    granted = re.findall(r"--allow-principal User:([\w-]+) --operation Write .*--topic ([\w\-\"$]+)", acls)
    for principal, topic in granted:
        writers.setdefault(topic, set()).add(principal)
    assert writers["policy-versions"] == {"policy-service"} and writers["revocations"] == {"iam"}
    assert writers["source-changes"] == {"cdc"}


def test_the_image_contains_every_package():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    copied = set(re.findall(r"^COPY (\w+) \1$", (ROOT / "Dockerfile").read_text(), re.M))
    assert {name.split(".")[0] for name in packages} <= copied  # subpackages come with their top level


def test_postgres_and_debezium_run_beside_kafka_with_the_documented_mapping():
    import json

    from schemas.cdc_mapping import parse

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert "wal_level=logical" in services["postgres"]["command"]
    connect = services["connect"]
    assert connect["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert connect["environment"]["BOOTSTRAP_SERVERS"] == services["worker"]["environment"]["KAFKA_BOOTSTRAP_SERVERS"]
    assert 'username="cdc"' in connect["environment"]["CONNECT_PRODUCER_SASL_JAAS_CONFIG"]  # the ACL's only writer
    config = json.loads((ROOT / "deploy" / "debezium" / "postgres-connector.json").read_text())["config"]
    assert config["transforms.route.replacement"] == "source-changes" and config["plugin.name"] == "pgoutput"
    assert all(v.startswith("${file:") for k, v in config.items() if "password" in k)  # never a literal
    worker = services["worker"]
    path = worker["environment"]["FRESHPLAN_CDC_MAPPING"]
    [mount] = [v for v in worker["volumes"] if v.startswith("./deploy/debezium:")]
    mapping = parse((ROOT / "deploy" / "debezium" / path.removeprefix(mount.split(":")[1] + "/")).read_text())
    assert set(config["table.include.list"].split(",")) == set(mapping.tables)
