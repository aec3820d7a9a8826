"""`freshplan chaos`: faults run against live workers and come back as table rows that say whether they held."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from agents.cli.main import parser
from bench.chaos import FAULTS, run_chaos, table
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(240)


async def test_chaos_rows_report_what_held(tmp_path):
    lines: list[str] = []
    outcomes = await run_chaos(tmp_path, lines.append, only=["hostile_requests", "id_collision", "forged_token"])
    assert [o.fault for o in outcomes][:2] == ["event id reused across topics", "hostile select bodies (1 MB query, "
                                               "2^64 budget, NaN, deep nesting, year 0)"]  # catalogue order
    assert outcomes[2].fault.startswith("100 forged freshness tokens") and "token_invalid" in outcomes[2].observed
    assert all(o.held for o in outcomes), outcomes
    assert len(lines) == 3 and "| fault | expected | observed | held |" in table(outcomes)
    help_text = " ".join(parser()._subparsers._group_actions[0].choices["chaos"].format_help().split())
    assert all(fault.__name__ in help_text for fault in FAULTS)  # --help names every fault


async def test_the_revocation_order_fault_holds(tmp_path):
    [outcome] = await run_chaos(tmp_path, lambda line: None, only=["revocation_order"])
    assert outcome.held, outcome


def test_the_documented_one_fault_command_prints_the_table_and_writes_json(tmp_path):
    # docs/operate.md's `freshplan chaos --only ...` line, run as shown (plus --out).
    line = next(line for line in (ROOT / "docs" / "operate.md").read_text().splitlines()
                if line.startswith(".venv/bin/freshplan chaos --only"))
    args = shlex.split(line.split("#", 1)[0])[1:]
    out = subprocess.run([sys.executable, "-m", "agents.cli", *args, "--out", str(tmp_path / "chaos.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| fault | expected | observed | held |" in out.stdout
    assert (tmp_path / "chaos.json").exists()
