"""A hostile review of the outbox prefetch (`agents.stream.outbox_prefetch`): each test failed against its first
version (commit 1631d8f), and passes since records acknowledged or refused that a writer job is about to delete
are `leaving` (reads pass over them) and the log of what left is kept only while a read is live.

The writer here is the real `Writer` thread, so a job submitted earlier runs first, as in a worker: an apply
job already on the writer when a flush submits its `_forget_sent` runs (and reads the outbox) before it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest

from agents.stream import publisher as publisher_module
from agents.stream.publisher import Publisher
from agents.stream.writer import Writer
from state.local_state import LocalState


class Producer:
    """Acknowledges every send at once (unless held), refuses keys in `refuse`, and remembers what it was given."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.values: dict[bytes, bytes] = {}  # the last value sent per key: what a compacted topic keeps
        self.refuse: set[bytes] = set()
        self.hold: asyncio.Event | None = None  # while set to an unset event, acknowledgements wait for it

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append(key)
        self.values[key] = value
        if key in self.refuse:
            raise ValueError("the producer refuses this record for good")
        loop = asyncio.get_running_loop()
        if self.hold is None:
            done = loop.create_future()
            done.set_result(None)
            return done
        hold = self.hold

        async def later():
            await hold.wait()

        return loop.create_task(later())


class App:
    def __init__(self) -> None:
        self.producer = Producer()


@pytest.fixture
def world(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    writer = Writer()
    app = App()
    yield state, writer, app, Publisher(state, app, writer.run, lambda: {}, prefetching=True)
    writer.close()
    state.close()


def _queue(state: LocalState, keys: list[bytes], value: bytes = b"v") -> None:
    """An apply job's records (due at once, as plans' announcements are), committed."""
    with state.store.transaction():
        state.outbox.add_many([("out", key, value) for key in keys])


def _apply_job(state: LocalState, publisher: Publisher, keys: list[bytes], value: bytes = b"v") -> None:
    """What `Replica._apply` does as far as the outbox goes: commit the batch's records, then `after_commit`."""
    _queue(state, keys, value)
    publisher.prefetched.read()


def _blocked_apply_job(state, publisher, keys, release: threading.Event, value: bytes = b"v"):
    """An apply job that is on the writer while the flush waits for the broker (it commits once `release` is set)."""
    def job():
        assert release.wait(10)
        _apply_job(state, publisher, keys, value)
    return job


def _release_on_gone(publisher: Publisher, release: threading.Event) -> None:
    """Let the blocked apply job go on once the flush has reported its acknowledgements or refusals
    (`OutboxPrefetch.gone`, or `leaving` for those a writer job is about to delete)."""
    for name in ("gone", "leaving"):
        report = getattr(publisher.prefetched, name)

        def reporting(seqs, report=report):
            report(seqs)
            release.set()

        setattr(publisher.prefetched, name, reporting)


def _twice(sent: list[bytes]) -> list[bytes]:
    return sorted(k for k, n in Counter(sent).items() if n > 1)


@pytest.mark.timeout(60)
async def test_a_fan_out_acknowledged_while_an_apply_job_runs_is_sent_twice(world):
    """From FORGET_NOW acknowledgements on, the flush deletes its rows in a writer job (`_forget_sent`) and never
    adds them to `acked`. An apply job already on the writer reads the outbox before that job runs: its read clears
    the marks of what `gone` just reported, and finds the rows (still in the file, not in `acked`). The rows are
    deleted next, so nothing passes over them any more: the flush the apply job kicks sends the whole fan-out
    again. In the old code the flush's read queued behind `_forget_sent` ("so it never sees them")."""
    state, writer, app, publisher = world
    fan_out = [b"f%05d" % i for i in range(publisher_module.FORGET_NOW)]
    await writer.run(_apply_job, state, publisher, fan_out)  # a policy version's fan-out, read by its apply job
    release = threading.Event()
    _release_on_gone(publisher, release)
    next_batch = asyncio.ensure_future(writer.run(_blocked_apply_job(state, publisher, [b"next"], release)))
    await publisher.publish()  # the flush the fan-out's batch kicked (the next batch is applied meanwhile)
    await next_batch
    await publisher.publish()  # the flush the next batch kicks (`publish_owned`)
    assert _twice(app.producer.sent) == []


@pytest.mark.timeout(30)
async def test_a_record_refused_while_an_apply_job_runs_is_sent_and_refused_again(world):
    """The same window for a refused record: `gone` reports it, `_forget_sent` (which replaces it by its dead
    letter) queues behind an apply job whose read finds it, and the next flush sends it again."""
    state, writer, app, publisher = world
    app.producer.refuse.add(b"too-big")
    await writer.run(_apply_job, state, publisher, [b"too-big", b"ok"])
    release = threading.Event()
    _release_on_gone(publisher, release)
    next_batch = asyncio.ensure_future(writer.run(_blocked_apply_job(state, publisher, [b"next"], release)))
    await publisher.publish()
    await next_batch
    await publisher.publish()
    assert _twice(app.producer.sent) == []


@pytest.mark.timeout(60)
async def test_a_fan_out_sent_again_after_the_next_batch_leaves_a_plan_s_older_record_last(world):
    """The same duplicate, seen on a compacted topic: the fan-out's record of a plan goes out again after the next
    batch's newer record of the same key (read on by the first flush), so the older one is what the topic keeps."""
    state, writer, app, publisher = world
    fan_out = [b"plan-%05d" % i for i in range(publisher_module.FORGET_NOW)]
    await writer.run(_apply_job, state, publisher, fan_out, b"v1")
    release = threading.Event()
    _release_on_gone(publisher, release)
    next_batch = asyncio.ensure_future(writer.run(_blocked_apply_job(state, publisher, [b"plan-00007"], release,
                                                                     b"v2")))
    await publisher.publish()
    await next_batch
    await publisher.publish()
    assert app.producer.values[b"plan-00007"] == b"v2"


@pytest.mark.timeout(30)
async def test_forced_interleaving_a_record_acknowledged_around_a_read_is_not_sent_again(world):
    """Called in the order the loop and the writer thread can interleave: the flush adds `a` to `acked`, the
    writer thread runs an apply job's `read` (it passes over `acked`), then the flush logs `a` as gone; once `a`
    is deleted (the idle timer's `forget_acknowledged`), the next flush must still not send it. The first version
    logged `a` before adding it to `acked`, and a read in between found it."""
    state, writer, app, publisher = world
    prefetch = publisher.prefetched
    await writer.run(_apply_job, state, publisher, [b"a"])
    rows, _ = prefetch.take()  # the flush kicked by that apply job
    state.outbox.acked.add([rows[0][0]])  # `a` acknowledged ...
    await writer.run(_apply_job, state, publisher, [b"b"])  # ... the writer thread's apply job reads here ...
    prefetch.gone([rows[0][0]])  # ... and the flush goes on
    await publisher.forget_acknowledged()  # the idle timer
    await publisher.publish()
    assert b"a" not in app.producer.sent and b"b" in app.producer.sent


@pytest.mark.timeout(30)
async def test_what_flushes_report_gone_is_kept_for_ever_without_an_apply_job_that_queued(world):
    """`gone` appends every acknowledged sequence number; only a `read` that finds something queued resets the
    list. Records queued by selects, recompiles, retention (no apply job) or by apply jobs on a quiet stream:
    the list grows by one int per record published, for as long as the worker runs (and `due`/`take` copy its
    tail into a set each time)."""
    state, writer, app, publisher = world
    for round_ in range(50):  # 50 selects' compiled plans, 20 records each, each flushed and forgotten
        await writer.run(_queue, state, [b"s%d-%d" % (round_, i) for i in range(20)])
        await publisher.publish()
        await publisher.forget_acknowledged()
    assert await writer.run(state.outbox.size) == 0
    assert len(publisher.prefetched._gone) < 100, f"{len(publisher.prefetched._gone)} sequence numbers kept"
