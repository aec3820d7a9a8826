"""`freshplan replay` rebuilds catalog, index and plans from the topics while the worker is stopped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ATLAS_REQUEST, ROOT
from tests.events import resource


async def test_replay_rebuilds_state_and_announces_what_changed(worker):
    fresh = await worker.load("atlas.jsonl")
    old = await worker.select(ATLAS_REQUEST, fresh)
    worker.stop()
    await worker.publish_events(resource("approved-waiver-W2"))  # arrives while the worker is down

    out = subprocess.run([sys.executable, "-m", "agents.cli", "replay", "--state-dir", str(worker.settings.state_dir)],
                         cwd=ROOT, env=worker.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["events"]["source-changes"] == 12 and summary["events"]["policy-versions"] == 1
    assert summary["plans_restored"] == 1 and summary["plans_changed"] == 1 and summary["backup"]

    await worker.restart()
    announced = await worker.records("plan-invalidations",
                                     lambda rs: any(r["plan_id"] == old["plan_id"] for r in rs))
    record = next(r for r in announced if r["plan_id"] == old["plan_id"])
    assert record["reason"] == "state_rebuilt" and record["successor_plan_id"]
    now = await worker.select(ATLAS_REQUEST)
    assert now["served_from"] == "cache" and now["plan_id"] == record["successor_plan_id"]
    assert next(s for s in now["slots"] if s["proposition"] == "waiver_valid")["state"] == "supported"


async def test_replay_skips_and_counts_bad_internal_records_and_keeps_the_wal_with_the_file(worker):
    fresh = await worker.load("atlas.jsonl")
    await worker.select(ATLAS_REQUEST, fresh)
    worker.kill()  # no clean close: committed work may still be in the write-ahead log
    await worker.publish([("plans", b"p-bad", b"not json"), ("plans", b"p-bad2", b'{"plan_id": 7}'),
                          ("plan-invalidations", b"p-bad3", b'{"plan_id": "plan-x"}')])
    db = worker.settings.db_path
    had_wal = db.with_name(db.name + ".wal").exists()

    out = subprocess.run([sys.executable, "-m", "agents.cli", "replay", "--state-dir", str(worker.settings.state_dir)],
                         cwd=ROOT, env=worker.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["bad_internal_records"] == {"plans": 2, "plan-invalidations": 1}
    assert summary["plans_restored"] == 1
    backup = Path(summary["backup"])
    assert backup.exists() and backup.with_name(backup.name + ".wal").exists() == had_wal
    print("write-ahead log kept aside:", had_wal)

    await worker.restart()
    counters = (await worker.get("/healthz"))["counters"]
    assert counters["bad_internal_records.plans"] == 2 and counters["bad_internal_records.plan-invalidations"] == 1
