"""Selects that must compile while the writer is busy share one job: each keeps its own answer, error and counts."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agents.stream.writer import Writer
from tests.conftest import ATLAS_REQUEST


def _gated():
    busy = asyncio.Event()

    async def run(fn, *args):
        await busy.wait()  # an input batch holds the writer
        return fn(*args)
    return busy, run


async def _joined(query, n: int) -> None:
    """Wait until `n` selects wait on the writer for their compile (each select reads before it joins)."""
    while query.compiles.waiting < n:
        await asyncio.sleep(0.002)


@pytest.mark.timeout(20)
async def test_the_job_s_counts_are_kept_when_the_first_caller_has_gone(setup):  # noqa: F811
    _, _, query = setup
    busy, run = _gated()
    tasks = [asyncio.ensure_future(query.select_async(dict(ATLAS_REQUEST, query=f"c{i}"), run)) for i in range(3)]
    await _joined(query, 3)
    tasks[0].cancel()  # its client went away; its plan is still compiled and stored
    busy.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert query.compiles.jobs == 1 and query.compiles.items == 3
    assert query.selects["compilations"] == 3 and query.selects["selects.compiled"] == 2


@pytest.mark.timeout(20)
async def test_an_unexpected_error_compiling_one_select_reaches_that_select_only(setup, monkeypatch):  # noqa: F811
    import compiler.pipeline as pipeline
    real = pipeline.resolve_request

    def failing(request, catalog, now):
        if request.query == "boom":
            raise KeyError("a bug one request runs into")
        return real(request, catalog, now)

    # Selects compiled together (compiler.batch) and each alone (compiler.pipeline) both resolve requests.
    monkeypatch.setattr(pipeline, "resolve_request", failing)
    monkeypatch.setattr("compiler.batch.resolve_request", failing)
    _, _, query = setup
    busy, run = _gated()
    tasks = [asyncio.ensure_future(query.select_async(dict(ATLAS_REQUEST, query=q), run)) for q in ("a", "boom", "b")]
    await _joined(query, 3)
    busy.set()
    answers = await asyncio.gather(*tasks, return_exceptions=True)
    assert answers[0]["served_from"] == answers[2]["served_from"] == "compiled"
    assert isinstance(answers[1], KeyError)


@pytest.mark.timeout(20)
async def test_selects_after_a_closed_writer_refused_a_job_are_refused_too_never_left_waiting(setup):  # noqa: F811
    _, _, query = setup
    writer = Writer()
    writer.close()
    with pytest.raises(RuntimeError):
        await query.select_async(dict(ATLAS_REQUEST, query="one"), writer.run_first)
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(query.select_async(dict(ATLAS_REQUEST, query="two"), writer.run_first), 3)


@pytest.mark.timeout(20)
async def test_a_job_cancelled_before_it_ran_leaves_no_gathering_for_later_selects_to_wait_on(setup):  # noqa: F811
    _, _, query = setup
    writer = Writer()
    release, running = threading.Event(), threading.Event()

    def hold() -> None:
        running.set()
        release.wait(30)

    busy = asyncio.ensure_future(writer.run(hold))
    # The writer must be inside `hold` before the select queues: a job queued first would run first.
    assert await asyncio.to_thread(running.wait, 10)
    first = asyncio.ensure_future(query.select_async(dict(ATLAS_REQUEST, query="one"), writer.run_first))
    while not writer._first:
        await asyncio.sleep(0.002)
    closing = asyncio.ensure_future(asyncio.to_thread(writer.close))  # cancels the queued job
    while writer._first:
        await asyncio.sleep(0.002)
    release.set()
    await closing
    await busy
    assert isinstance((await asyncio.gather(first, return_exceptions=True))[0], asyncio.CancelledError)
    later = Writer()
    try:  # a writer that runs jobs again (a test's, or the next in a restarted worker)
        answer = await asyncio.wait_for(query.select_async(dict(ATLAS_REQUEST, query="two"), later.run_first), 5)
        assert answer["served_from"] == "compiled"
    finally:
        later.close()


@pytest.mark.timeout(30)
async def test_a_flood_of_selects_is_compiled_in_jobs_of_bounded_size(setup):  # noqa: F811
    from agents.web.select_compiles import GATHERED_AT_MOST

    _, _, query = setup
    busy, run = _gated()
    tasks = [asyncio.ensure_future(query.select_async(dict(ATLAS_REQUEST, query=f"f{i}"), run))
             for i in range(GATHERED_AT_MOST + 5)]
    await _joined(query, GATHERED_AT_MOST + 5)
    busy.set()
    answers = await asyncio.gather(*tasks)
    assert all(a["served_from"] == "compiled" for a in answers)
    assert query.compiles.jobs == 2 and query.compiles.items == GATHERED_AT_MOST + 5


@pytest.mark.timeout(20)
async def test_a_select_that_waited_while_its_plan_was_compiled_elsewhere_is_not_called_a_cache_hit(setup):  # noqa: F811
    _, _, query = setup
    busy = asyncio.Event()

    async def run(fn, *args):
        await busy.wait()
        query.select(dict(ATLAS_REQUEST))  # a recompilation (here, another select) stores the plan first
        return fn(*args)

    waiting = asyncio.ensure_future(query.select_async(dict(ATLAS_REQUEST), run))
    await _joined(query, 1)
    busy.set()
    answer = await waiting
    assert answer["served_from"] == "recompiled"  # missing when asked: the bench's cached selects leave it out
    assert query.selects["selects.recompiled"] == 1 and query.selects["compilations"] == 1
    assert query.select(dict(ATLAS_REQUEST))["served_from"] == "cache"


@pytest.mark.timeout(120)
async def test_through_the_broker_selects_compiled_together_each_get_their_own_answer(worker):
    """A worker gathers selects that arrive while its writer is busy into one compile pass: a refusal stays with
    its caller, and every compiled plan is the one the worker then serves from its store for that select."""
    fresh = await worker.load("atlas.jsonl")
    await worker.select(ATLAS_REQUEST, fresh)  # caught up: the selects below compile, none waits for input
    bad = dict(ATLAS_REQUEST, purpose="marketing")  # found, then refused by the compile pass
    for attempt in range(3):  # gathering needs the writer busy as they arrive: most first tries show it
        before = (await worker.get("/healthz"))["select_compiles"]
        bodies = [dict(ATLAS_REQUEST, query=f"round {attempt} question {i}") for i in range(10)] + [bad]

        async def post(body):
            async with worker.http.post(f"{worker.url}/v1/select", json=body) as resp:
                return resp.status, await resp.json()

        answers = await asyncio.gather(*(post(b) for b in bodies))
        after = (await worker.get("/healthz"))["select_compiles"]
        *compiled, (status, refused) = answers
        assert status == 422 and refused["error"]["code"] == "purpose_not_allowed", refused
        assert all(s == 200 and doc["served_from"] == "compiled" for s, doc in compiled), compiled
        assert len({doc["plan_key"] for _, doc in compiled}) == 10
        for body, (_, doc) in zip(bodies[:-1], compiled, strict=True):
            again = await worker.select(body)
            assert again["served_from"] == "cache" and again["plan_id"] == doc["plan_id"]
        if after["selects"] - before["selects"] > after["jobs"] - before["jobs"]:
            return  # at least two of them shared a job
    pytest.fail(f"no two of 3 x 11 concurrent selects shared a compile job: {before} -> {after}")


@pytest.mark.timeout(20)
async def test_a_storage_error_compiling_selects_together_refuses_every_select_of_the_job(setup, monkeypatch):  # noqa: F811
    """The together pass reads the file: a DuckDB error there is the file's, not a request's, so it is not
    retried one by one and nothing is answered: each caller gets 503 state_unreadable, and later selects too."""
    import duckdb

    from agents.web.query import StateError

    _, applier, query = setup

    def broken(*args, **kwargs):
        raise duckdb.IOException("disk gone under the candidates read")

    monkeypatch.setattr(applier.plans, "snapshot", broken)
    busy, run = _gated()
    tasks = [asyncio.ensure_future(query.select_async(dict(ATLAS_REQUEST, query=f"s{i}"), run)) for i in range(3)]
    await _joined(query, 3)
    busy.set()
    answers = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(a, StateError) and a.code == "state_unreadable" and a.status == 503 for a in answers), answers
    assert query.compiles.jobs == 1 and query.unreadable == "IOException"
    with pytest.raises(StateError):
        await query.select_async(dict(ATLAS_REQUEST, query="later"), run)
