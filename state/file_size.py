"""How large the state file is and how much of it is free: blocks deleted rows and departed shards left behind."""

from __future__ import annotations

from typing import Any

import duckdb


def file_size(db: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The file's bytes, the bytes its free blocks hold, and the block size (a cursor of its own, any thread).

    DuckDB reuses a free block for the next data written, and gives the file's length back only
    for free blocks at its end: a worker whose shards moved to another keeps a file that size,
    mostly free, until new data fills it. Nothing here reads the tables.
    """
    row = db.execute("SELECT block_size, total_blocks, free_blocks FROM pragma_database_size() "
                     "WHERE database_name = current_database()").fetchone()
    if row is None:  # not a file (an in-memory database has no blocks to count)
        return {"bytes": 0, "free_bytes": 0, "block_size": 0}
    block_size, total, free = (int(v or 0) for v in row)
    return {"bytes": block_size * total, "free_bytes": block_size * free, "block_size": block_size}
