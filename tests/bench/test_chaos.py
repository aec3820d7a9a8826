"""`freshplan chaos`: faults run against live workers and come back as table rows that say whether they held."""

from __future__ import annotations

import pytest

from agents.cli import parser
from bench.chaos import FAULTS, run_chaos, table

pytestmark = pytest.mark.timeout(240)


async def test_chaos_rows_report_what_held(tmp_path):
    lines: list[str] = []
    outcomes = await run_chaos(tmp_path, lines.append, only=["hostile_requests", "id_collision"])
    assert [o.fault for o in outcomes] == ["event id reused across topics", "hostile select bodies (1 MB query, "
                                           "2^64 budget, NaN, deep nesting, year 0)"]  # catalogue order
    assert all(o.held for o in outcomes), outcomes
    assert len(lines) == 2 and "| fault | expected | observed | held |" in table(outcomes)
    help_text = " ".join(parser()._subparsers._group_actions[0].choices["chaos"].format_help().split())
    assert all(fault.__name__ in help_text for fault in FAULTS)  # --help names every fault


async def test_the_revocation_order_fault_holds(tmp_path):
    [outcome] = await run_chaos(tmp_path, lambda line: None, only=["revocation_order"])
    assert outcome.held, outcome
