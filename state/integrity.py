"""Check that a DuckDB state file reads back whole before a worker trusts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Run in a child process: DuckDB (1.5) can crash the process outright on some corrupted blocks,
# and a check that takes the worker down with it would be no check at all.
_CHECK = r"""
import os, sys
import duckdb
path = sys.argv[1]
try:
    db = duckdb.connect(path, read_only=True)
except duckdb.IOException as exc:
    text = str(exc)
    print("in_use" if "lock" in text.lower() else "unreadable", text.replace(chr(10), " ")[:300], sep="\t")
    sys.exit(1)
except duckdb.Error as exc:
    print("unreadable", str(exc).replace(chr(10), " ")[:300], sep="\t")
    sys.exit(1)
try:
    # Hashing a large file takes seconds: DuckDB's progress bar would be drawn on the line this check's
    # verdict goes to, and a verdict glued to a bar's unfinished line is no longer read as one.
    db.execute("SET enable_progress_bar = false; SET enable_progress_bar_print = false")
    block_size = db.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]
    tables = db.execute("SELECT schema_name, table_name FROM duckdb_tables()").fetchall()
    # Three 4 KiB headers, then every block a table's data lies in. Not the header's block count:
    # it also counts free blocks past the end, which a checkpoint cuts off a healthy file.
    highest = max((db.execute(f"SELECT max(block_id) FROM pragma_storage_info('\"{schema}\".\"{table}\"') "
                              "WHERE persistent AND block_id >= 0").fetchone()[0] for (schema, table) in tables),
                  key=lambda b: -1 if b is None else b, default=None)
    expected = 3 * 4096 + block_size * ((highest if highest is not None else -1) + 1)
    if os.path.getsize(path) < expected:
        print("truncated", f"{os.path.getsize(path)} bytes on disk, its tables' blocks need {expected}", sep="\t")
        sys.exit(1)
    for (schema, table) in tables:
        # Hashing every column reads every data block, and DuckDB checks each block's checksum.
        db.execute(f'SELECT bit_xor(hash(COLUMNS(*))) FROM "{schema}"."{table}"').fetchall()
except duckdb.Error as exc:
    print("unreadable", str(exc).replace(chr(10), " ")[:300], sep="\t")
    sys.exit(1)
print("ok")
"""


def check(path: Path | str, timeout: float = 600.0) -> str | None:
    """None when the file is absent or reads back whole; otherwise a sentence saying what is wrong."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        done = subprocess.run([sys.executable, "-c", _CHECK, str(path)], capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    except subprocess.TimeoutExpired:
        return f"reading it back took longer than {timeout:.0f}s"
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 0 and last == "ok":
        return None
    kind, _, detail = last.partition("\t")
    if kind == "in_use":
        return f"another process holds it open ({detail})"
    if kind == "truncated":
        return f"it is truncated: {detail}"
    if kind == "unreadable":
        return f"it is damaged: {detail}"
    if done.returncode < 0:
        return f"it is damaged: DuckDB crashed reading it (signal {-done.returncode})"
    return f"it could not be read back (exit {done.returncode}: {done.stderr.strip()[-300:]})"
