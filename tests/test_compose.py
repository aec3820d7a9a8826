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
    assert int(env["FRESHPLAN_PARTITIONS"]) >= 3   # three workers need three partitions to share
    assert worker["volumes"] and all(":" not in v for v in worker["volumes"])  # one state volume per replica


def test_the_image_contains_every_package():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    copied = set(re.findall(r"^COPY (\w+) \1$", (ROOT / "Dockerfile").read_text(), re.M))
    assert set(packages) <= copied
