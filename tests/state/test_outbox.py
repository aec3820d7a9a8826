"""The outbox: standby rows wait for their partition's owner; promotion and pruning by position."""

from __future__ import annotations

from state.local_state import LocalState


def _rows(n: int) -> list[tuple[str, bytes, bytes]]:
    return [("out", f"k{i}".encode(), f"v{i}".encode()) for i in range(n)]


def test_standby_rows_are_published_only_once_promoted(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    box = state.outbox
    box.add_many(_rows(3), [("clock", 0, 5), ("clock", 0, 6), ("clock", 1, 6)], standby=True)
    box.add_many([("out", b"s", b"select")])  # a select's plan: no cause, due at once
    assert [v for *_, v in box.pending()] == [b"select"]
    assert box.standby_size() == 3

    # The owner of clock/0 was handed the partition at offset 6: offset 5 was the previous owner's.
    assert box.promote("clock", 0, 6, 6) == 1
    assert [v for *_, v in box.pending()] == [b"v1", b"select"]   # queue order is kept
    assert box.standby_size() == 1

    box.prune({("clock", 1): 6})
    assert box.standby_size() == 1      # committed 6 means offset 6 is not yet done elsewhere
    box.prune({("clock", 1): 7})
    assert box.standby_size() == 0
    state.close()


def test_an_outbox_from_before_scale_out_is_migrated_with_its_rows_due(tmp_path):
    import duckdb

    path = tmp_path / "old.duckdb"
    old = duckdb.connect(str(path))
    old.execute("CREATE SEQUENCE outbox_seq; CREATE TABLE outbox (seq BIGINT DEFAULT nextval('outbox_seq'), "
                "topic VARCHAR, key BLOB, value BLOB); INSERT INTO outbox (topic, key, value) VALUES ('t', 'k', 'v')")
    old.close()
    state = LocalState.open(path)
    assert [(t, v) for _, t, _, v in state.outbox.pending()] == [("t", b"v")]
    assert state.outbox.standby_size() == 0
    state.close()


def test_a_plan_dependencies_record_too_large_with_its_receipt_goes_out_whole_without_it(tmp_path):
    import orjson

    from schemas.outbound import RECORD_OVERHEAD_BYTES
    from state.outbox import OutboundLimit

    # The receipt (on `receipts` too) doubled the record: compacting cannot shrink it, so it was dead-lettered,
    # and a worker taking the plan over had no record of it to restore.
    plan = {"plan_id": "p1", "plan_key": "pk-1", "admitted": [{"resource_id": "r1", "content": "c" * 100}],
            "dependencies": [f"resource:r{i}" for i in range(100)]}
    record = orjson.dumps(dict(plan, receipt=dict(plan, receipt_id="rcpt-1")))
    state = LocalState.open(tmp_path / "f.duckdb")
    state.outbox.limit = OutboundLimit(len(orjson.dumps(plan)) + 4 + RECORD_OVERHEAD_BYTES, "dead-letters",
                                       frozenset({"plan-dependencies"}))
    state.outbox.add_many([("plan-dependencies", b"pk-1", record)])
    [(_, topic, _, value)] = state.outbox.pending()
    assert topic == "plan-dependencies" and orjson.loads(value) == plan  # whole (restorable), without the receipt
    state.close()


def test_records_are_queued_in_order_whether_few_or_many(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    few, many = _rows(3), [("out", f"m{i}".encode(), f"w{i}".encode()) for i in range(40)]
    state.outbox.add_many(few, [("clock", 0, 1), None, ("clock", 0, 2)], standby=True)
    state.outbox.add_many(many)
    state.outbox.add_many(few[:1])
    assert [v for *_, v in state.outbox.pending()] == [b"v1"] + [v for *_, v in many] + [b"v0"]  # no source: due
    assert state.outbox.promote("clock", 0, 1, 2) == 2
    assert [v for *_, v in state.outbox.pending()] == [b"v0", b"v1", b"v2"] + [v for *_, v in many] + [b"v0"]
    state.close()


def test_acknowledged_rows_are_passed_over_until_a_transaction_that_commits_deletes_them(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    box = state.outbox
    box.add_many(_rows(3))
    first, second, third = [seq for seq, *_ in box.pending()]
    box.acked.add([first, second])
    assert [v for *_, v in box.pending()] == [b"v2"] and box.size() == 1 and box.any_due()
    assert state.reader().outbox.size() == 1  # the views over the file pass over them too

    try:
        with state.store.transaction():
            taken = box.forget_acked()
            raise RuntimeError("the batch fails")
    except RuntimeError:
        pass
    assert sorted(taken) == [first, second] and len(box.acked) == 2  # rolled back: still to delete
    with state.store.transaction():
        taken = box.forget_acked()
    box.acked.deleted(taken)
    assert len(box.acked) == 0 and [v for *_, v in box.pending()] == [b"v2"]
    assert state.store.db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 1

    box.acked.add([third])
    assert box.size() == 0 and not box.any_due()
    state.close()
    reopened = LocalState.open(tmp_path / "f.duckdb")  # a crash before their deletion: sent again
    assert [v for *_, v in reopened.outbox.pending()] == [b"v2"]
    reopened.close()


def test_a_record_that_cannot_fit_is_lettered_under_a_bounded_key_and_a_refused_letter_is_dropped(tmp_path):
    import hashlib

    import orjson

    from schemas.outbound import DEAD_LETTER_KEY_BYTES, fits
    from state.outbox import OutboundLimit

    state = LocalState.open(tmp_path / "f.duckdb")
    box = state.outbox
    box.limit = OutboundLimit(5_000, "dead-letters", frozenset())
    key = b"k" * 4_800  # fits alone; with a value it does not, and a letter naming it whole would not either
    with state.store.transaction():
        box.add_many([("out", key, b"x" * 400)], [("source-changes", 0, 9)])
    [(seq, topic, letter_key, value)] = box.pending()
    assert topic == "dead-letters" and letter_key == b"sha256:" + hashlib.sha256(key).hexdigest().encode()
    assert fits(letter_key, value, 5_000) and len(letter_key) <= DEAD_LETTER_KEY_BYTES
    assert orjson.loads(value)["outbound_key"] == letter_key.decode()
    assert box.db.execute("SELECT src_topic, src_offset FROM outbox WHERE seq = ?", [seq]).fetchone() == (
        "source-changes", 9)  # it still holds the group's commit for its event
    with state.store.transaction():  # the broker refuses the letter itself: no letter of a letter
        box.replace_with_dead_letters(box.pending(), "refused")
    assert box.pending() == [] and state.store.counters().get("outbound_dropped") == 1
    state.close()


def test_a_refused_records_letter_keeps_the_records_source(tmp_path):
    from state.outbox import OutboundLimit

    state = LocalState.open(tmp_path / "f.duckdb")
    box = state.outbox
    box.limit = OutboundLimit(100_000, "dead-letters", frozenset())
    with state.store.transaction():
        box.add_many([("out", b"k", b"v")], [("source-changes", 0, 5)])
        box.replace_with_dead_letters(box.pending(), "refused by the broker")
    [(seq, topic, _, _)] = box.pending()
    assert topic == "dead-letters"
    assert box.db.execute("SELECT src_topic, src_partition, src_offset FROM outbox WHERE seq = ?",
                          [seq]).fetchone() == ("source-changes", 0, 5)
    state.close()


def test_an_input_dead_letter_too_large_to_store_is_replaced_by_a_letter_naming_it_not_dropped(tmp_path):
    import orjson

    from state.outbox import OutboundLimit

    state = LocalState.open(tmp_path / "f.duckdb")
    box = state.outbox
    box.limit = OutboundLimit(5_000, "dead-letters", frozenset())
    with state.store.transaction():  # an input event's letter carries its original: here 10 KB of it
        box.add_many([("dead-letters", b"k", b"x" * 10_000)], [("source-changes", 0, 3)])
    [(_, topic, key, value)] = box.pending()
    assert topic == "dead-letters" and key == b"k"
    assert orjson.loads(value)["error_class"] == "record_too_large" and orjson.loads(value)["original_size"] == 10_000
    assert not state.store.counters().get("outbound_dropped")
    state.close()


def test_standby_rows_of_a_topic_blocked_on_a_reset_stay_while_the_other_topics_are_pruned(tmp_path):
    """A worker blocked on one reset topic still applies the others: their standby rows must not pile up,
    while the blocked topic's committed offsets name another incarnation's events (the rebase releases them)."""
    from agents.worker.loops import _prune
    state = LocalState.open(tmp_path / "f.duckdb")
    state.outbox.add_many(_rows(2), [("clock", 0, 5), ("revocations", 0, 5)], standby=True)
    _prune(state, {("clock", 0): 9, ("revocations", 0): 9}, blocked=frozenset({"revocations"}))
    assert state.store.db.execute("SELECT src_topic FROM outbox WHERE standby").fetchall() == [("revocations",)]
    state.close()


def test_a_record_keeps_its_own_partition_compacted_or_promoted_and_its_dead_letter_goes_where_keys_hash(tmp_path):
    import orjson

    from schemas.outbound import RECORD_OVERHEAD_BYTES
    from state.outbox import OutboundLimit

    plan = {"plan_id": "p1", "plan_key": "pk-1", "dependencies": [f"resource:r{i}" for i in range(50)]}
    whole = orjson.dumps(dict(plan, receipt=dict(plan, receipt_id="rcpt-1")))  # fits only without its receipt
    state = LocalState.open(tmp_path / "f.duckdb")
    box = state.outbox
    box.limit = OutboundLimit(len(orjson.dumps(plan)) + 4 + RECORD_OVERHEAD_BYTES, "dead-letters",
                              frozenset({"plan-dependencies"}))
    with state.store.transaction():
        box.add_many([("plan-dependencies", b"pk-1", whole), ("out", b"big", b"x" * 10_000),
                      ("plan-dependencies", b"pk-2", b"{}"), ("out", b"plain", b"v")],
                     [("source-changes", 0, 1)] * 4, standby=True, partitions=[3, 2, 1, None])
        assert box.due() == []
        box.promote("source-changes", 0, 1, 1)
    due = box.due()
    assert [(t, k, p) for _, t, k, _, p in due] == [
        ("plan-dependencies", b"pk-1", 3), ("dead-letters", due[1][2], None), ("plan-dependencies", b"pk-2", 1),
        ("out", b"plain", None)]
    assert "receipt" not in orjson.loads(due[0][3])   # the whole record without its receipt, where it was placed
    assert [row[:4] for row in due] == box.pending()  # `pending` is `due` without the partitions
    state.close()
