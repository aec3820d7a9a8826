"""A third hostile review of the outbox prefetch, aimed at 3a84e66's quiet batches: a batch whose apply job found
`Outbox.queued` and `Store.rebases` unchanged since the previous read started no flush, unless a flush left records
unacknowledged. Each `prefetch` case failed against 3a84e66 (records waited for the 1 s timer); the quiet batches
were taken out again, and a flush that sends a read cut at `READ_ROWS` reads on past it however few of its records
are left. They stay as guards: a batch must start a flush whenever the publisher before the prefetch did.

Each test runs twice: `prefetch` (the worker's configuration) and `no-prefetch` (the publisher as it was before
1631d8f: every flush reads the outbox itself, and every batch without owned spans asks `any_due`). The
`no-prefetch` runs pass, so each `prefetch` failure is new with the prefetch.

The writer is the real `Writer` thread. No test runs the 1 s `flush_outbox` timer: a record that has not left within
the wait given (0.5 s) waits for it (or for the next batch that queues something). Where one job must land between
two others, the test says how it forces that order.
"""

from __future__ import annotations

import asyncio

import pytest

import agents.stream.publisher as publisher_module
from agents.stream.publisher import Publisher
from agents.stream.writer import Writer
from state.local_state import LocalState


class Producer:
    """Acknowledges every send at once unless a test hooks it; remembers what it was given."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.hook = None  # async (key) -> awaitable acknowledgement, or None for the default

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append(key)
        if self.hook is not None:
            ack = await self.hook(key)
            if ack is not None:
                return ack
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class App:
    def __init__(self) -> None:
        self.producer = Producer()


@pytest.fixture(params=[True, False], ids=["prefetch", "no-prefetch"])
def world(request, tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    writer = Writer()
    app = App()
    yield state, writer, app, lambda: Publisher(state, app, writer.run, lambda: {}, prefetching=request.param)
    writer.close()
    state.close()


def _apply_job(state: LocalState, publisher: Publisher, keys: list[bytes]) -> None:
    """What `Replica._apply` does as far as the outbox goes: commit the batch's records (due: plans' records are
    never on standby), then `after_commit` (`OutboxPrefetch.read`). No keys: a batch that queued nothing."""
    if keys:
        with state.store.transaction():
            state.outbox.add_many([("out", key, b"v") for key in keys],
                                  [("source-changes", 0, i) for i, _ in enumerate(keys)])
    if publisher.prefetched is not None:
        publisher.prefetched.read()


def _queue_job(state: LocalState, keys: list[bytes]) -> None:
    """A writer job that is no apply job and kicks no flush (`PlanFeed._settle` announcing stale adopted plans)."""
    with state.store.transaction():
        state.outbox.add_many([("out", key, b"v") for key in keys])


async def _batch(state: LocalState, writer: Writer, publisher: Publisher, keys: list[bytes]) -> None:
    """One replica batch: its apply job on the writer, then `after_apply` (no owned partitions, nothing held)."""
    await writer.run(_apply_job, state, publisher, keys)
    await publisher.publish_owned([], held=False)


async def _settled(publisher: Publisher, seconds: float = 0.5) -> None:
    """Let any flush a kick started run (well under the 1 s timer), and wait for it to end."""
    await asyncio.sleep(seconds)
    if publisher._flushing is not None:
        await publisher._flushing


@pytest.mark.timeout(60)
async def test_a_truncated_read_clears_unsent_and_quiet_batches_leave_the_rest_of_a_fan_out_for_the_timer(
        world, monkeypatch):
    """More records due than one read takes (a fan-out). A flush (the timer's) reads the first `READ_ROWS` on the
    writer and sends them. While it waits for their acknowledgements, the next apply job queues a record and reads
    the outbox: the same first `READ_ROWS`, truncated there. Of the flush's round, `FORGET_NOW` are acknowledged
    (`leaving`, so `gone` for that read) and the rest fail for a transient reason: `_unsent` is set. The flush that
    batch kicked takes the read: fewer than `READ_ROWS` rows are left of it, fewer than `FORGET_NOW`, nothing was
    queued since (`complete`), so once they are acknowledged it stops without reading on: everything past the read's
    last row is still due, and `_unsent` is cleared. The next batch queued nothing: it is quiet and kicks nothing,
    so the rest of the fan-out waits for the 1 s timer. Before 3a84e66 that batch asked `any_due` and kicked a
    flush; without the prefetch the kicked flush read the outbox itself and sent everything.

    `READ_ROWS` is 2,500 here instead of 50,000 (3,000 records instead of 60,000); `FORGET_NOW` is the real 2,000.
    The apply job reaches the writer during the flush's first send (the test runs it from the producer's send)."""
    monkeypatch.setattr(publisher_module, "READ_ROWS", 2_500)
    state, writer, app, make = world
    publisher = make()
    keys = [b"k%d" % i for i in range(3_000)]
    await writer.run(_queue_job, state, keys)  # a fan-out, queued earlier (its flush failed, say)
    failing = set(keys[2_000:2_500])
    failed: set[bytes] = set()

    async def hook(key):
        if key == keys[0] and not app.producer.sent[1:]:  # the next batch's apply job, then its `after_apply`
            await writer.run(_apply_job, state, publisher, [b"x"])
            await publisher.publish_owned([], held=False)
        if key in failing and key not in failed:
            failed.add(key)
            ack = asyncio.get_running_loop().create_future()
            ack.set_exception(RuntimeError("request timed out (transient)"))
            return ack
        return None

    app.producer.hook = hook
    await publisher.publish()  # the timer's flush: 500 records not acknowledged (they stay queued)
    assert len(failed) == 500
    await _settled(publisher)  # the flush the batch kicked
    await _batch(state, writer, publisher, [])  # the next batch queued nothing
    await _settled(publisher)
    left = await writer.run(lambda: state.outbox.pending(10_000, None))
    assert left == [], f"{len(left)} records still due without the timer, from {left[0][2]!r} to {left[-1][2]!r}"


@pytest.mark.timeout(30)
async def test_records_a_writer_job_queues_between_a_quiet_batch_s_read_and_its_after_apply_wait_for_the_timer(
        world):
    """A quiet batch's apply job runs; a job that queues records and kicks no flush (`PlanFeed._settle` announcing
    the stale plans it adopted) was submitted while it ran, so it runs next on the writer. The batch's
    `publish_owned` trusts the apply job's read (nothing queued since the read before) and returns: those records
    wait for the next batch that queues something, or the 1 s timer. Before 3a84e66, `publish_owned` asked `any_due`
    in a writer job submitted after that one, found them and kicked a flush.

    The order is forced by submitting the queueing job right after the apply job, before awaiting the apply job."""
    state, writer, app, make = world
    publisher = make()
    await _batch(state, writer, publisher, [b"a"])
    await _settled(publisher, 0.1)
    assert app.producer.sent == [b"a"]
    applying = asyncio.ensure_future(writer.run(_apply_job, state, publisher, []))  # the quiet batch
    await asyncio.sleep(0)  # its task submits the apply job to the writer
    settling = asyncio.ensure_future(writer.run(_queue_job, state, [b"stale"]))  # submitted while it runs
    await applying
    await publisher.publish_owned([], held=False)  # the replica's `after_apply`
    await settling
    await _settled(publisher)
    assert b"stale" in app.producer.sent, "the announcement was not sent without the timer"


@pytest.mark.timeout(30)
async def test_a_send_that_fails_after_a_quiet_batch_checked_unsent_is_retried_only_by_the_timer(world):
    """A batch queues `a` and kicks a flush, which sends it. While the broker has not answered, the next batch
    (it queued nothing) reaches `publish_owned`: `_unsent` is still False, so it returns without kicking. Then the
    send fails (a request timeout). The flush sets `_unsent` and stops, but no kick is waiting: `a` is retried by
    the 1 s timer or the batch after next. Before 3a84e66 that batch asked `any_due` (`a` was not acknowledged),
    kicked, and the flush went round once more as soon as it stopped, sending `a` again at once.

    The order is the natural one: the test holds the acknowledgement until the next batch has been applied."""
    state, writer, app, make = world
    publisher = make()
    loop = asyncio.get_running_loop()
    ack = loop.create_future()
    first = []

    async def hook(key):
        if key == b"a" and not first:
            first.append(key)
            return ack
        return None

    app.producer.hook = hook
    await _batch(state, writer, publisher, [b"a"])
    for _ in range(200):
        if first:
            break
        await asyncio.sleep(0.005)
    assert first, "the flush did not send a"
    await _batch(state, writer, publisher, [])  # the next batch queued nothing
    ack.set_exception(RuntimeError("request timed out (transient)"))
    await _settled(publisher)
    left = await writer.run(lambda: state.outbox.pending(10, None))
    assert app.producer.sent.count(b"a") == 2 and left == [], f"sent {app.producer.sent}; still due {left}"
