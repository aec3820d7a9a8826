"""Finding 12: a damaged DuckDB file is refused at start, and a file that fails later is reported, not served."""

from __future__ import annotations

import os
import time

import duckdb
import orjson
import pytest

from tests.conftest import ATLAS_REQUEST, _spawn

pytestmark = pytest.mark.timeout(180)


async def _stopped_with_state(worker):
    """Load the atlas, compile one plan, stop cleanly; return the state file."""
    await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    worker.stop()
    return worker.settings.db_path


def _run_expecting_refusal(worker) -> str:
    started = time.monotonic()
    proc = _spawn(worker.env, worker.log_path.with_name("refused.log"))
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = worker.log_path.with_name("refused.log").read_text()
    assert proc.returncode not in (0, None), out
    assert time.monotonic() - started < 30
    assert "Traceback" not in out, out
    assert "freshplan replay" in out and str(worker.settings.db_path) in out, out
    return out


def _overwrite_data_block(path) -> None:
    """Overwrite the block that holds the resources' content with garbage (DuckDB still opens the file)."""
    db = duckdb.connect(str(path))
    try:
        block_size = db.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]
        block = db.execute("SELECT max(block_id) FROM pragma_storage_info('resources') "
                           "WHERE column_name = 'content' AND block_id >= 0").fetchone()[0]
    finally:
        db.close()
    with open(path, "r+b") as f:
        f.seek(3 * 4096 + block * block_size + 64)
        f.write(b"\xa5" * 4096)


async def test_a_truncated_state_file_refuses_to_start(worker):
    path = await _stopped_with_state(worker)
    os.truncate(path, os.path.getsize(path) // 2)
    out = _run_expecting_refusal(worker)
    assert "truncated" in out


async def test_a_corrupted_state_file_refuses_to_start(worker):
    path = await _stopped_with_state(worker)
    _overwrite_data_block(path)
    duckdb.connect(str(path), read_only=True).close()  # opening alone does not notice
    out = _run_expecting_refusal(worker)
    assert "damaged" in out


async def test_a_state_file_that_fails_while_running_refuses_selects_and_health(worker):
    path = await _stopped_with_state(worker)
    await worker.restart()  # a cold start: the plans are on disk, not in DuckDB's buffers
    os.truncate(path, 3 * 4096)  # the disk loses the file under the running worker
    refused = await worker.select(ATLAS_REQUEST, expect=503)
    assert refused["error"]["code"] == "state_unreadable" and refused["error"]["pass"] == "state"
    async with worker.http.get(f"{worker.url}/healthz") as resp:
        health = await resp.json()
        assert resp.status == 503 and health["status"] == "state_unreadable", health
    again = await worker.select(ATLAS_REQUEST, expect=503)  # nothing read from it is trusted any more
    assert again["error"]["code"] == "state_unreadable"
    assert worker.proc.poll() is None  # refused, not dead
    worker.kill()  # its shutdown would checkpoint into the damaged file


async def test_a_scrape_of_a_file_that_failed_while_running_is_refused_and_marks_the_worker_unreadable(worker):
    import aiohttp

    path = await _stopped_with_state(worker)
    await worker.restart()
    os.truncate(path, 3 * 4096)
    refused = await worker.get("/metrics", expect=503)  # a JSON error, never a 500 with a traceback
    assert refused["error"]["code"] == "state_unreadable" and refused["error"]["pass"] == "state"
    async with aiohttp.ClientSession() as anonymous:  # liveness, without credentials, now says so too
        async with anonymous.get(f"{worker.url}/healthz") as resp:
            assert resp.status == 503 and (await resp.json()) == {"status": "state_unreadable"}
    assert (await worker.select(ATLAS_REQUEST, expect=503))["error"]["code"] == "state_unreadable"
    worker.kill()  # its shutdown would checkpoint into the damaged file


def test_the_check_passes_a_good_file_and_an_absent_one(tmp_path):
    from state.integrity import check
    from state.store import Store

    assert check(tmp_path / "absent.duckdb") is None
    Store(tmp_path / "good.duckdb").close()
    assert check(tmp_path / "good.duckdb") is None
    (tmp_path / "junk.duckdb").write_bytes(b"not a database" * 100)
    assert check(tmp_path / "junk.duckdb") is not None


def test_the_check_passes_a_file_a_checkpoint_shrank(tmp_path):
    """A drained table's blocks are cut off the file's end; the header still counts them as free."""
    from state.integrity import check

    path = tmp_path / "shrunk.duckdb"
    db = duckdb.connect(str(path))
    db.execute("CREATE TABLE keep (v VARCHAR); CREATE TABLE churn (v VARCHAR)")
    db.execute("INSERT INTO keep SELECT repeat('a', 100) FROM range(1000)")
    db.execute("CHECKPOINT")
    db.execute("INSERT INTO churn SELECT repeat(md5(range::VARCHAR), 600) FROM range(3000)")
    db.execute("CHECKPOINT")
    db.execute("DELETE FROM churn")
    db.execute("CHECKPOINT")
    db.close()
    header = duckdb.connect(str(path), read_only=True)
    block_size, total = header.execute("SELECT block_size, total_blocks FROM pragma_database_size()").fetchone()
    header.close()
    assert os.path.getsize(path) < 3 * 4096 + block_size * total  # the shape that was refused
    assert check(path) is None
    os.truncate(path, 3 * 4096 + block_size)  # now a block its table needs is gone
    assert "truncated" in (check(path) or "")


async def test_a_plan_record_arriving_after_the_file_failed_does_not_stop_the_worker(worker):
    from tests.conftest import eventually

    path = await _stopped_with_state(worker)
    [record, *_] = await worker.records("plan-dependencies", bool)
    await worker.restart()
    os.truncate(path, 3 * 4096)
    # The plan feed must park what it reads, and judge it against the file: with the file gone, that failed too,
    # and the feed's task took the worker down with it. The record is a peer's compilation of the worker's plan.
    key = record.pop("_key")
    peer = orjson.dumps(dict(record, plan_id="compiled-by-a-peer"))
    await worker.publish([("plan-dependencies", key, peer)])

    async def met() -> bool:  # the feed read the record and met the file (or the worker died of it)
        return worker.proc.poll() is not None or (
            "the state file failed under the plan feed" in worker.log_path.read_text(errors="replace"))

    await eventually(met, timeout=30, what="the plan feed meeting the failed file")
    assert worker.proc.poll() is None  # the feed waits to read again; the worker stays up, refusing
    assert (await worker.select(ATLAS_REQUEST, expect=503))["error"]["code"] == "state_unreadable"
    worker.kill()  # its shutdown would checkpoint into the damaged file
