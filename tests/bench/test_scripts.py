"""The benchmark scripts run end to end at reduced size (their full-size figures go in notes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.timeout(240)
def test_select_latency_benchmark_runs():
    out = subprocess.run([sys.executable, "bench/select_latency.py", "--resources", "3000", "--principals", "50",
                          "--types", "4", "--requests", "20"], cwd=ROOT, capture_output=True, text=True,
                         timeout=220)
    assert out.returncode == 0, out.stderr[-3000:]
    for path in ("compile", "cache", "bm25_top10"):
        assert any(line.startswith(path) for line in out.stdout.splitlines()), out.stdout
