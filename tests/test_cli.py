"""The commands of README.md and docs/operate.md: `freshplan run` with its embedded broker, `select`, `plan`,
`status`, `load`, `schemas export`, `--help`, and the same select with curl."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from streams.broker import free_port
from tests.conftest import ROOT

FRESHPLAN = [sys.executable, "-m", "agents.cli"]


def test_help_describes_every_command():
    out = subprocess.run(FRESHPLAN + ["--help"], capture_output=True, text=True, check=True).stdout
    for command in ("run", "load", "select", "plan", "status", "schemas", "cdc"):
        assert command in out
    run_help = subprocess.run(FRESHPLAN + ["run", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--load" in run_help and "--state-dir" in run_help


def test_schemas_export_writes_one_schema_per_topic(tmp_path):
    out = subprocess.run(FRESHPLAN + ["schemas", "export", str(tmp_path / "contracts")], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout)["schemas"] == 11
    written = sorted(p.name for p in (tmp_path / "contracts").iterdir())
    assert "plan-dependencies.schema.json" in written
    assert "source-changes.schema.json" in written and "dead-letters.schema.json" in written
    assert "cdc-mapping.schema.json" in written
    for path in (tmp_path / "contracts").iterdir():
        assert json.loads(path.read_text())["$id"].endswith(path.name)


@pytest.mark.timeout(180)
def test_run_with_embedded_broker_serves_the_atlas_scenario(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "FRESHPLAN_TOKEN")}
    env.update(FRESHPLAN_WEB_PORT=str(free_port()), FRESHPLAN_STATE_DIR=str(tmp_path / "state"),
               FRESHPLAN_FRESHNESS_WAIT="30")
    log_path = tmp_path / "run.log"
    with open(log_path, "wb") as log:
        # The README's run command, with only port and state directory moved aside.
        proc = subprocess.Popen(FRESHPLAN + ["run", "--load", "scenarios/atlas.jsonl"], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        run_file = tmp_path / "state" / "run.json"
        deadline = time.monotonic() + 90
        while not run_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        info = json.loads(run_file.read_text())
        token = _loaded_token(log_path)
        again = subprocess.run(FRESHPLAN + ["load", "scenarios/atlas.jsonl", "--state-dir", str(tmp_path / "state")],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["events"] == 13  # re-published; the worker deduplicates by event_id
        select = subprocess.run(FRESHPLAN + ["select", "--file", "scenarios/atlas-request.json",
                                             "--at-least-as-fresh", token, "--state-dir", str(tmp_path / "state")],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert select.returncode == 0, select.stderr + log_path.read_text()[-3000:]
        plan = json.loads(select.stdout)
        assert {a["resource_id"] for a in plan["admitted"]} == {"facility-F102", "workflow-E88", "policy-P3"}
        shown = next(b for b in re.findall(r"```json\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
                     if '"plan_id"' in b)
        assert _abridges(json.loads(shown), plan), "README.md's first select no longer abridges the answer"
        status = subprocess.run(FRESHPLAN + ["plan", plan["plan_id"], "--url", info["http"]], cwd=ROOT,
                                env=env, capture_output=True, text=True, timeout=60)
        assert json.loads(status.stdout)["status"] == "fresh"
        shown = subprocess.run(FRESHPLAN + ["status", "--state-dir", str(tmp_path / "state")], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "revocations" in shown.stdout and "last atlas-" in shown.stdout, shown
        assert "shard              entity partitions [0" in shown.stdout and "  worker http" in shown.stdout, shown
        # The generated secret: in run.json only (owner-readable), sent by the CLI, required by the API.
        secret = info["token"]
        assert len(secret) >= 32 and stat.S_IMODE(run_file.stat().st_mode) == 0o600
        auth = {"Authorization": f"Bearer {secret}"}
        health = urllib.request.Request(f"{info['http']}/healthz", headers=auth)
        with urllib.request.urlopen(health, timeout=10) as resp:
            assert json.loads(resp.read())["now"] is not None  # wall-clock ticks are on by default
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{info['http']}/v1/plans/{plan['plan_id']}"), timeout=10)
        refused.value.close()
        assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"].startswith("Bearer")
        assert secret not in log_path.read_text() and str(run_file) in log_path.read_text()
        curled = _documented_curl(tmp_path, tmp_path / "state", env["FRESHPLAN_WEB_PORT"])
        assert curled[0]["plan_id"] == plan["plan_id"]  # the same select, answered the same
        assert curled[1] == {"status": "ready"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert json.loads((tmp_path / "state" / "run.json").read_text()) == {"token": secret}  # kept for the next start
    broker = info["bootstrap_servers"]
    host, port = broker.rsplit(":", 1)
    import socket
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()


def _abridges(shown, real) -> bool:
    """Whether `shown` is `real` with parts left out: "..." stands for any value, list items or keys."""
    if shown == "..." or (isinstance(shown, str) and shown.endswith("...") and isinstance(real, str)
                          and real.startswith(shown[:-3])):
        return True
    if isinstance(shown, dict):
        return isinstance(real, dict) and all(k == "..." or (k in real and _abridges(v, real[k]))
                                              for k, v in shown.items())
    if isinstance(shown, list):
        # Items in order, each matching a distinct item of the real list; "..." items stand for the rest.
        rest = list(real) if isinstance(real, list) else None
        if rest is None:
            return False
        for item in (i for i in shown if i != "..."):
            match = next((r for r in rest if _abridges(item, r)), None)
            if match is None:
                return False
            rest = rest[rest.index(match) + 1:]
        return "..." in shown or not rest
    return shown == real


def _documented_curl(workdir, state_dir, port: str) -> list[dict]:
    """Run docs/operate.md's curl lines as shown, from a directory whose `.freshplan` is this worker's state."""
    text = (ROOT / "docs" / "operate.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "curl" in b)
    lines = [line.split("   #")[0] for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    (workdir / ".freshplan").symlink_to(state_dir)
    (workdir / "scenarios").symlink_to(ROOT / "scenarios")
    answers = []
    for curl in lines[1:]:
        script = f"{lines[0]}\n{curl}".replace("6066", port)
        done = subprocess.run(["bash", "-c", script], cwd=workdir, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        answers.append(json.loads(done.stdout))
    return answers


def _loaded_token(log_path) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            if line.startswith("freshplan: loaded"):
                return line.rsplit("freshness token ", 1)[1].rstrip(")")
        time.sleep(0.2)
    raise AssertionError(log_path.read_text()[-3000:])


def test_an_abridged_answer_may_leave_parts_out_but_not_change_them():
    real = {"state": "INSUFFICIENT", "withheld": 1, "slots": [{"p": "a", "s": 1}, {"p": "b", "s": 2}], "t": "ft2.xyz"}
    assert _abridges({"state": "INSUFFICIENT", "slots": [{"p": "b"}, "..."], "t": "ft2..."}, real)
    assert not _abridges({"state": "SUFFICIENT"}, real)
    assert not _abridges({"slots": [{"p": "b"}, {"p": "a"}]}, real)  # out of order
    assert not _abridges({"slots": [{"p": "a"}]}, real)               # an item left out without "..."
    assert not _abridges({"missing": 1}, real)
