"""The resources the writer remembers between batches are the rows the file holds, whatever the batches did."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from schemas.records import Resource, SourceChange
from state.catalog_resources import drop_resources
from state.local_state import LocalState

ENTITIES = ("A", "B", "C")
MEMO = "catalog.resources"  # apply_resources' memo: id -> (version, deleted, entity, class, supports, ...)


def _upsert(rng: random.Random, rid: str, version: int) -> SourceChange:
    lists = [tuple(rng.sample("pqr", rng.randint(0, 2))) for _ in range(2)]
    record = Resource(id=rid, version=version, entity=rng.choice(ENTITIES), evidence_class="approved_waiver",
                      tokens=version % 7, content=f"v{version}", supports=lists[0], contradicts=lists[1])
    return SourceChange(kind="resource", op="upsert", record_id=rid, record=record)


def _batch(rng: random.Random, ids: list[str], versions: dict[str, int],
           kept_lists: dict[str, tuple]) -> list[SourceChange]:
    """Upserts (mostly newer, some older), deletes, and edits that keep the lists, in one order."""
    changes = []
    for _ in range(rng.choice([1, 5, 40, 120, 300])):
        rid = rng.choice(ids)
        if rng.random() < 0.2:
            changes.append(SourceChange(kind="resource", op="delete", record_id=rid, record=None))
            continue
        versions[rid] = versions.get(rid, 0) + rng.randint(-1, 2)
        change = _upsert(rng, rid, max(1, versions[rid]))
        kept = kept_lists.get(rid)
        if kept is not None and rng.random() < 0.7:  # the lists as last upserted: the update that leaves them out
            change = replace(change, record=replace(change.record, supports=kept[0], contradicts=kept[1]))
        kept_lists[rid] = (change.record.supports, change.record.contradicts)
        if rng.random() < 0.1:  # content left out (Debezium's unchanged TOASTed value): filled from a live row
            change = replace(change, record=replace(change.record, content="__unavailable"),
                             unavailable=(("content", "content"),))
        changes.append(change)
    return changes


def _memo_matches_file(state: LocalState) -> list[str]:
    memo = state.store.cached(MEMO, dict)
    rows = {r[0]: r[1:] for r in state.store.db.execute(
        "SELECT id, version, deleted, entity, evidence_class, supports, contradicts, log_tick, log_snapshot "
        "FROM resources WHERE id IN (SELECT unnest(?))", [sorted(memo)]).fetchall()}
    return [f"{rid}: remembered {held}, stored {rows.get(rid)}" for rid, held in memo.items()
            if _comparable(held) != _comparable(rows.get(rid))]


def _comparable(row: tuple | None) -> tuple | None:
    """A remembered or stored row with its lists as tuples (the file gives lists, records tuples)."""
    return None if row is None else (*row[:4], tuple(row[4] or ()), tuple(row[5] or ()), *row[6:])


@pytest.mark.parametrize("seed", range(12))
def test_the_remembered_resources_are_the_stored_rows_after_every_batch(tmp_path, seed):
    """Random batches of upserts, deletes (also of rows upserted earlier in the batch), moves between entities,
    edits that keep the lists, batches of one worker's shard only, rollbacks, hand-backs and reopened files: after
    each, every resource the writer remembers is stored as remembered (a memo ahead of the file made an edit update
    no row, or leave lists the record no longer has)."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(rng.choice([8, 60, 400]))]
    versions: dict[str, int] = {}
    kept_lists: dict[str, tuple] = {}
    path = tmp_path / "x.duckdb"
    state = LocalState.open(path)
    try:
        for step in range(14):
            roll = rng.random()
            if roll < 0.08:
                state.close()
                state = LocalState.open(path)
                continue
            if roll < 0.12:
                with state.store.transaction():
                    drop_resources(state.store, [rng.choice(ENTITIES)])
                continue
            mine = set(rng.sample(ENTITIES, rng.randint(1, 3)))
            changes = _batch(rng, ids, versions, kept_lists)
            try:
                with state.store.transaction():
                    state.catalog.apply_resources(changes, lambda e, mine=mine: e is None or e in mine)
                    if rng.random() < 0.1:
                        raise LookupError("rolled back")
            except LookupError:
                pass
            assert _memo_matches_file(state) == [], f"seed {seed}, step {step}"
    finally:
        state.close()


@pytest.mark.parametrize("seed", range(8))
def test_a_stream_applied_in_its_batches_or_one_change_at_a_time_stores_the_same_rows(tmp_path, seed):
    """The same changes give the same rows and verdicts however they are cut into batches, what the writer remembers
    forgotten now and then as a restart does: a batch that deleted an upsert of its own once filled a later left-out
    column from the deleted record, where single changes were dead-lettered."""
    rng = random.Random(1000 + seed)
    ids = [f"r{i}" for i in range(rng.choice([4, 12, 40]))]
    versions: dict[str, int] = {}
    kept_lists: dict[str, tuple] = {}
    batches = [_batch(rng, ids, versions, kept_lists) for _ in range(8)]
    stored, verdicts = [], []
    for cut in ("batches", "single"):
        state = LocalState.open(tmp_path / f"{cut}.duckdb")
        said = []
        try:
            for batch in batches if cut == "batches" else [[c] for b in batches for c in b]:
                with state.store.transaction():
                    said += [getattr(v, "error_class", v) for v in state.catalog.apply_resources(batch)]
                if rng.random() < 0.3:
                    state.store.forget()  # as a restart would: the next change reads the file
            stored.append(state.store.db.execute("SELECT * FROM resources ORDER BY id").fetchall())
        finally:
            state.close()
        verdicts.append([v if isinstance(v, str) or v is None else "applied" for v in said])
    assert stored[0] == stored[1]
    assert verdicts[0] == verdicts[1]
