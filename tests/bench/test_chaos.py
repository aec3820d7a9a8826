"""`freshplan chaos`: faults run against live workers and come back as table rows that say whether they held."""

from __future__ import annotations

import pytest

from agents.cli import parser
from bench.chaos import FAULTS, run_chaos, table

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
