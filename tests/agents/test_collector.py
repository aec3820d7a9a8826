"""The garbage collector's policy: start-up objects frozen out of full collections, every pause measured."""

from __future__ import annotations

import gc

import pytest

from agents.ops.collector import Collector
from tests.conftest import ATLAS_REQUEST, eventually, launch


@pytest.fixture
def unfrozen():
    """Whatever a test freezes goes back to the collector afterwards (the test process is shared)."""
    yield
    gc.unfreeze()


def test_settle_takes_what_exists_out_of_full_collections(unfrozen):
    collector = Collector()
    scanned_before = len(gc.get_objects())
    frozen = collector.settle()
    assert frozen == gc.get_freeze_count() == collector.frozen > 0
    # A full collection walks what gc.get_objects() lists; the frozen objects are no longer in it.
    assert len(gc.get_objects()) < scanned_before / 10
    made_later = [[i] for i in range(1000)]
    assert sum(1 for o in gc.get_objects() if o is made_later) == 1  # new objects are collected as before
    assert collector.as_dict()["frozen"] == frozen


def test_the_settling_collection_is_reported_apart_from_the_pauses_serving_meets(unfrozen):
    collector = Collector().install()
    try:
        collector.settle()
        # Made on purpose before the ready line: an alert on the pauses must not fire at every start.
        assert collector.collections[2] == 0 and collector.pause_max[2] == 0.0
        assert collector.settle_seconds > 0 and collector.as_dict()["settle_seconds"] >= 0
        gc.collect(2)  # one made later is counted as before
        assert collector.collections[2] == 1 and collector.pause_max[2] > 0
    finally:
        collector.remove()


def test_a_collection_another_thread_makes_while_one_settles_is_counted(unfrozen, monkeypatch):
    import threading

    collector = Collector().install()
    freeze, seen = gc.freeze, []

    def freeze_after_another_threads_collection():  # the GIL can change hands between collect and freeze
        other = threading.Thread(target=gc.collect, args=(0,))
        other.start()
        other.join()
        seen.append(collector.collections[0])  # what settling itself collects cannot be among these
        freeze()

    monkeypatch.setattr(gc, "freeze", freeze_after_another_threads_collection)
    try:
        collector.settle()
        assert seen == [1] and collector.collections[2] == 0
    finally:
        collector.remove()


def test_a_disabled_collector_freezes_nothing(unfrozen):
    collector = Collector(enabled=False)
    assert collector.settle() == 0 and gc.get_freeze_count() == 0 and collector.frozen == 0


def test_pauses_are_measured_by_generation_until_removed():
    collector = Collector().install()
    try:
        collector.install()  # twice is once
        assert gc.callbacks.count(collector._observe) == 1
        gc.collect(2)
        gc.collect(0)
        assert collector.collections[2] >= 1 and collector.collections[0] >= 1
        assert collector.pause_max[2] > 0 and collector.pause_total >= collector.pause_max[2]
    finally:
        collector.remove()
    seen = list(collector.collections)
    gc.collect(2)
    assert collector.collections == seen and collector._observe not in gc.callbacks


async def test_a_ready_worker_has_frozen_its_start_up_and_reports_its_pauses(worker):
    fresh = await worker.load("atlas.jsonl")
    await worker.select(ATLAS_REQUEST, fresh)
    # HTTP answers before start-up has finished: the freeze comes with the ready line.
    health = await eventually(lambda: _frozen(worker), what="start-up frozen")
    assert health["gc"]["frozen"] > 10_000  # modules, the Faust app, schemas: tens of thousands of objects
    assert health["gc"]["settle_seconds"] > 0  # the collection before the freeze, apart from the pauses
    assert len(health["gc"]["collections"]) == 3 and health["gc"]["collections"][0] > 0
    async with worker.http.get(f"{worker.url}/metrics") as resp:
        text = await resp.text()
    assert 'freshplan_gc_pause_max_seconds{generation="2"}' in text
    # The state file's figures, read on the status thread (see state/file_size.py).
    assert health["state_file"]["block_size"] == 16 * 1024 and health["state_file"]["bytes"] > 0
    assert "freshplan_state_file_bytes" in text and "freshplan_state_file_free_bytes" in text
    # Timers and background loops ran all along without failing (see agents/ops/chores.py).
    assert {k: v for k, v in health["background_jobs"].items() if k != "runs"} == {"failures": {}, "last_error": {},
                                                                               "failing_now": []}
    assert all(n >= 1 for n in health["background_jobs"]["runs"].values())  # a timer shows once it has run
    assert "# TYPE freshplan_background_job_failures_total counter" in text


async def _frozen(worker) -> dict | None:
    health = await worker.get("/healthz")
    return health if health["gc"]["frozen"] else None


async def test_the_setting_turns_freezing_off(broker, tmp_path):
    async with launch(broker, tmp_path / "w", FRESHPLAN_GC_FREEZE="0") as running:
        async def ready() -> bool:  # the run file is written once start-up has finished (after the freeze)
            return running.settings.run_file.exists()

        await eventually(ready, what="worker ready")
        health = await running.get("/healthz")
    assert health["gc"]["frozen"] == 0 and health["gc"]["collections"][0] > 0
