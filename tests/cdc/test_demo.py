"""`freshplan cdc demo`, the documented walkthrough, runs end to end: a Postgres update invalidates a plan."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agents.cli import cdc_local
from tests.conftest import ROOT


@pytest.mark.skipif(cdc_local.missing() is not None, reason=str(cdc_local.missing()))
@pytest.mark.timeout(240)
def test_the_cdc_walkthrough_shows_the_invalidation_and_the_new_plan(tmp_path):
    done = subprocess.run([sys.executable, "-m", "agents.cli", "cdc", "demo", "--dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    first = next(line for line in lines if line.startswith("4. plan "))
    plan_id = first.split()[2].rstrip(":")
    assert "waiver_valid supported" in first
    assert any(line.startswith(f"6. plan {plan_id} is invalidated (source_changed, cause dbz:") for line in lines)
    last = next(line for line in lines if line.startswith("7. new plan "))
    assert plan_id not in last and "waiver_valid unknown" in last
