"""The writer thread and the loop probe: applying and compiling run off the event loop that serves HTTP."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agents.ops.loop_probe import LoopProbe
from agents.stream.writer import THREAD_NAME, Writer, inline
from compiler.errors import RequestError
from tests.conftest import ATLAS_REQUEST
from tests.events import resource


async def test_every_job_runs_on_the_one_writer_thread_in_order():
    writer = Writer()
    try:
        seen: list[tuple[str, int]] = []
        await asyncio.gather(*[writer.run(lambda i=i: seen.append((threading.current_thread().name, i)))
                               for i in range(20)])
        assert [i for _, i in seen] == list(range(20))  # one thread: submission order is run order
        assert {name for name, _ in seen} == {f"{THREAD_NAME}_0"}
        assert threading.current_thread().name not in {name for name, _ in seen}
        assert await writer.run(Writer.on_writer_thread) and not Writer.on_writer_thread()
        with pytest.raises(ZeroDivisionError):  # a job's error reaches the awaiting caller
            await writer.run(lambda: 1 / 0)
        assert writer.jobs == 22
    finally:
        writer.close()


async def test_the_loop_keeps_running_while_a_job_holds_the_writer():
    writer, probe = Writer(), LoopProbe(interval=0.001)
    release = threading.Event()
    try:
        job = asyncio.ensure_future(writer.run(release.wait, 30))
        before = probe.samples
        task = asyncio.ensure_future(probe.run())
        while probe.samples < before + 5:  # the loop goes on sampling while the job waits
            await asyncio.sleep(0.001)
        assert not job.done()
        release.set()
        assert await job is True
        task.cancel()
    finally:
        release.set()
        writer.close()


async def test_the_probe_records_a_blocked_loop():
    sampled: list[float] = []
    probe = LoopProbe(interval=0.001, budget=0.02, on_sample=sampled.append)
    task = asyncio.ensure_future(probe.run())
    while not probe.samples:
        await asyncio.sleep(0.001)
    assert probe.over_budget == 0 or max(sampled) > 0.02  # a busy machine may stall the loop on its own
    before = probe.over_budget
    time.sleep(0.05)  # the kind of stall an apply batch on the loop used to cause
    seen = probe.samples
    while probe.samples == seen:
        await asyncio.sleep(0.001)
    task.cancel()
    assert probe.max_stall >= 0.045 and probe.as_dict()["loop_stall_samples"] == probe.samples
    assert probe.over_budget >= before + 1 and probe.as_dict()["loop_stalls_over_budget"] == probe.over_budget
    assert len(sampled) == probe.samples and max(sampled) == probe.max_stall  # each sample reaches the metric


async def test_a_cache_hit_never_waits_for_the_writer_and_a_miss_is_compiled_by_it(setup):  # noqa: F811
    _, _, query = setup
    ran: list[str] = []

    async def writer_run(fn, *args):
        ran.append(fn.__name__)
        return fn(*args)

    first = await query.select_async(ATLAS_REQUEST, writer_run)
    assert first["served_from"] == "compiled" and ran == ["_take_and_compile"]
    again = await query.select_async(ATLAS_REQUEST, writer_run)
    assert again["served_from"] == "cache" and ran == ["_take_and_compile"]  # the hit read its own cursor only
    assert again["plan_id"] == first["plan_id"] and again["freshness_token"] == first["freshness_token"]
    assert query.selects["selects.compiled"] == 1 and query.selects["compilations"] == 1
    assert (await query.select_async(ATLAS_REQUEST, inline))["served_from"] == "cache"


async def test_selects_that_must_compile_while_the_writer_is_busy_share_one_job(setup):  # noqa: F811
    _, _, query = setup
    busy = asyncio.Event()

    async def writer_run(fn, *args):
        await busy.wait()  # an input batch holds the writer
        return fn(*args)

    bodies = [dict(ATLAS_REQUEST, query=f"question {i}") for i in range(3)] + [
        dict(ATLAS_REQUEST, decision_type="no.such.decision")]
    selecting = [asyncio.ensure_future(query.select_async(body, writer_run)) for body in bodies]
    await asyncio.sleep(0.01)
    busy.set()
    answers = await asyncio.gather(*selecting, return_exceptions=True)
    assert [a["served_from"] for a in answers[:3]] == ["compiled"] * 3
    assert len({a["plan_id"] for a in answers[:3]}) == 3
    assert isinstance(answers[3], RequestError) and answers[3].code == "unknown_decision_type"  # to it alone
    assert query.compiles.jobs == 1 and query.compiles.items == 4
    assert query.selects["selects.compiled"] == 3 and query.selects["compilations"] == 3
    # Asked again, each is a cache hit on the loop's cursor: all three were stored.
    again = [(await query.select_async(body, writer_run))["served_from"] for body in bodies[:3]]
    assert again == ["cache"] * 3


async def test_through_the_broker_events_are_applied_on_the_writer_thread_and_the_loop_is_probed(worker):
    fresh = await worker.load("atlas.jsonl")
    old = await worker.select(ATLAS_REQUEST, fresh)
    events = [resource(f"approved-waiver-W{i}", version=1) for i in range(2, 42)]
    fresh = await worker.publish_events(*events)
    await worker.records("plan-invalidations", lambda rs: any(r["plan_id"] == old["plan_id"] for r in rs))
    assert (await worker.select(ATLAS_REQUEST, fresh))["plan_id"] != old["plan_id"]
    health = await worker.get("/healthz")
    assert health["writer"]["thread"].startswith(THREAD_NAME)  # the apply batch ran there, not on the loop
    assert health["writer"]["jobs"] > 0
    assert health["loop_stall_samples"] > 0 and isinstance(health["loop_stall_max_seconds"], float)
    assert health["loop_stall_budget_seconds"] == 0.02 and health["loop_stalls_over_budget"] >= 0
    assert health["status_reads"]["thread"].startswith("freshplan-status")  # the file's figures, read off the loop
    assert (await worker.get(f"/v1/plans/{old['plan_id']}"))["status"] == "invalidated"  # read there as well
    reads = (await worker.get("/healthz"))["status_reads"]["reads"]
    assert reads >= health["status_reads"]["reads"] + 2
    # An id the service never issued is refused without a read: a flood of them cannot starve the status thread.
    for made_up in ("plan-" + "f" * 4000, "plan-unknown", "PLAN-0123456789ABCDEF0123"):
        assert (await worker.get(f"/v1/plans/{made_up}", expect=404))["error"]["code"] == "unknown_plan"
    assert (await worker.get("/healthz"))["status_reads"]["reads"] == reads + 1  # this health read alone
    async with worker.http.get(f"{worker.url}/metrics") as resp:
        text = await resp.text()
    assert "freshplan_loop_stall_max_seconds" in text
    # Every probe sample lands in the histogram (the probe keeps sampling, so at least as many as health saw).
    samples = next(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("freshplan_loop_stall_seconds_count"))
    assert samples >= health["loop_stall_samples"] > 0
    assert 'freshplan_loop_stall_seconds_bucket{le="0.02"}' in text


async def test_work_nobody_waits_on_runs_after_every_job_queued_before_it_starts():
    """A select's compile queued behind a backlog of recompiles runs as soon as the running job ends."""
    writer = Writer(later_waits_at_most=60)
    release = threading.Event()
    try:
        seen: list[str] = []
        running = asyncio.ensure_future(writer.run(release.wait, 30))
        while writer._now:  # the blocking job has started
            await asyncio.sleep(0.001)
        later = [asyncio.ensure_future(writer.run_later(seen.append, f"later-{i}")) for i in range(3)]
        await asyncio.sleep(0.01)
        now = [asyncio.ensure_future(writer.run(seen.append, f"now-{i}")) for i in range(2)]
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(running, *later, *now)
        assert seen == ["now-0", "now-1", "later-0", "later-1", "later-2"]
    finally:
        release.set()
        writer.close()


async def test_a_caller_waiting_goes_ahead_of_input_batches_but_never_starves_them():
    """A select's compile runs after the running job, not after the input batches queued before it; a flood of
    them lets one batch through after every `first_in_a_row`."""
    writer = Writer(later_waits_at_most=60, first_in_a_row=2, first_ahead_at_most=60)
    release = threading.Event()
    try:
        seen: list[str] = []
        running = asyncio.ensure_future(writer.run(release.wait, 30))
        while writer._now:  # the blocking job has started
            await asyncio.sleep(0.001)
        later = asyncio.ensure_future(writer.run_later(seen.append, "later"))
        now = [asyncio.ensure_future(writer.run(seen.append, f"batch-{i}")) for i in range(2)]
        await asyncio.sleep(0.01)
        first = [asyncio.ensure_future(writer.run_first(seen.append, f"select-{i}")) for i in range(5)]
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(running, later, *now, *first)
        assert seen == ["select-0", "select-1", "batch-0", "select-2", "select-3", "batch-1", "select-4", "later"]
    finally:
        release.set()
        writer.close()


async def _blocked(submit) -> tuple[asyncio.Future, threading.Event]:
    """A job holding the writer until the event is set, once it has started (not merely been queued)."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(30)

    running = asyncio.ensure_future(submit(hold))
    while not started.is_set():
        await asyncio.sleep(0.001)
    return running, release


async def test_an_input_batch_waits_behind_callers_for_a_bounded_time_however_few_jobs_they_are():
    """Selects compiled together can take most of a second per job: once a batch has waited `first_ahead_at_most`,
    it runs after the running job, not after `first_in_a_row` more of them."""
    writer = Writer(later_waits_at_most=60, first_in_a_row=4, first_ahead_at_most=0.05)
    running, release = await _blocked(writer.run_first)
    try:
        seen: list[str] = []
        batch = asyncio.ensure_future(writer.run(seen.append, "batch"))
        first = [asyncio.ensure_future(writer.run_first(seen.append, f"select-{i}")) for i in range(3)]
        await asyncio.sleep(0.1)  # the batch has waited past the bound while the first job ran
        release.set()
        await asyncio.gather(running, batch, *first)
        assert seen == ["batch", "select-0", "select-1", "select-2"]
    finally:
        release.set()
        writer.close()


async def test_past_the_bound_callers_and_batches_run_oldest_first_so_neither_starves():
    """A writer always behind has a batch waiting past the bound whenever a job ends: a caller that has waited
    longer than the oldest batch still runs before it."""
    writer = Writer(later_waits_at_most=60, first_in_a_row=4, first_ahead_at_most=0.01)
    running, release = await _blocked(writer.run)
    try:
        seen: list[str] = []
        first = [asyncio.ensure_future(writer.run_first(seen.append, "select-0"))]
        await asyncio.sleep(0.02)
        batches = [asyncio.ensure_future(writer.run(seen.append, f"batch-{i}")) for i in range(2)]
        await asyncio.sleep(0.02)
        first.append(asyncio.ensure_future(writer.run_first(seen.append, "select-1")))
        await asyncio.sleep(0.05)  # every job now waited past the bound
        release.set()
        await asyncio.gather(running, *batches, *first)
        assert seen == ["select-0", "batch-0", "batch-1", "select-1"]
    finally:
        release.set()
        writer.close()


async def test_a_closed_writer_cancels_what_is_queued_and_refuses_more():
    writer = Writer()
    release = threading.Event()
    running = asyncio.ensure_future(writer.run(release.wait, 30))
    while writer._now:
        await asyncio.sleep(0.001)
    queued = asyncio.ensure_future(writer.run(lambda: "ran"))
    await asyncio.sleep(0.01)
    closing = asyncio.ensure_future(asyncio.to_thread(writer.close))  # waits for the running job
    while not queued.done():
        await asyncio.sleep(0.001)
    release.set()
    await closing
    assert await running is True
    with pytest.raises(asyncio.CancelledError):
        await queued
    with pytest.raises(RuntimeError):
        await writer.run(lambda: None)


async def test_work_nobody_waits_on_still_runs_while_other_jobs_keep_coming():
    """A stream that keeps the writer busy must not starve successors, retention and pruning for good."""
    writer = Writer(later_waits_at_most=0.05)
    try:
        seen: list[str] = []
        stop = asyncio.Event()

        async def stream() -> None:  # three jobs in flight: one runs, two wait, a new one for each that ends
            running = {asyncio.ensure_future(writer.run(time.sleep, 0.005)) for _ in range(3)}
            while not stop.is_set():
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                running |= {asyncio.ensure_future(writer.run(time.sleep, 0.005)) for _ in done}
            await asyncio.gather(*running)

        streaming = asyncio.ensure_future(stream())
        await asyncio.sleep(0.02)
        await asyncio.wait_for(writer.run_later(seen.append, "later"), 5)
        assert seen == ["later"]
        stop.set()
        await streaming
    finally:
        writer.close()


async def test_a_failing_job_nobody_waits_on_reaches_its_caller_and_the_writer_goes_on():
    """A DuckDB error inside a recompile or retention job must surface to its loop, not stop the writer."""
    writer = Writer()
    try:
        with pytest.raises(ZeroDivisionError):
            await writer.run_later(lambda: 1 / 0)
        assert await writer.run(lambda: "next") == "next"
        assert await writer.run_later(lambda: "later") == "later"
    finally:
        writer.close()
