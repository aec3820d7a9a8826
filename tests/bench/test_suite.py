"""`freshplan bench --quick` runs every comparison through the broker and writes its artefacts."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from tests.conftest import ROOT


@pytest.mark.timeout(400)
def test_bench_quick_writes_results_summary_and_plots(broker, tmp_path):
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers)
    out = subprocess.run([sys.executable, "-m", "agents.cli", "bench", "--quick", "--out", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=380)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "caches: 150/150 events" in out.stderr          # progress while it runs
    [result_file] = [p for p in tmp_path.glob("*.json") if not p.name.endswith("-quality.json")]
    result = orjson.loads(result_file.read_bytes())
    path = result["invalidation_path"]
    assert path["throughput"]["ceiling_bare_faust"]["events_per_second"] > 0
    assert path["throughput"]["freshplan"]["events"] == 300 and path["throughput"]["ratio_to_ceiling"] > 0
    assert path["latency_by_rate"]["100"]["count"] > 0
    assert path["fanout"]["invalidations_seen"] == path["fanout"]["fanout_plans"] > 600   # announced first
    assert path["fanout"]["bare_producer_seconds"] > 0
    caches = result["caches"]["contenders"]
    assert caches["freshplan"]["stale_serves"] == 0 and caches["flush_all"]["stale_serves"] == 0
    assert caches["ttl_60s"]["stale_serves"] > 0          # the workload does make cached plans stale
    assert {t["measure"].split(" (")[0] for t in result["targets"]} >= {
        "events/s vs bare Faust agent", "stale serves", "unnecessary invalidations announced"}
    for t in result["targets"]:                           # each printed with its verdict
        assert ("met   " if t["met"] else "MISSED") + "  " + t["measure"] in out.stdout
    summary = result_file.with_suffix(".md").read_text()
    assert "## Targets" in summary and "bare Faust agent" in summary and "plain_top_k" in summary
    plots = list(tmp_path.glob("*.png"))
    assert len(plots) == 3 and all(p.stat().st_size > 5_000 for p in plots)
    assert (tmp_path / result["quality"]["file"]).exists() and (tmp_path / result["profile"]["file"]).exists()
