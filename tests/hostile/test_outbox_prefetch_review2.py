"""A second hostile review of the outbox prefetch: each `prefetch` case failed against b1a124d (records `leaving`
until `_forget_sent` ran), and passes since a forget that did not commit passes over the read made meanwhile
(`OutboxPrefetch.failed_forgets`) and a round's rows are marked `leaving` only once the previous forget succeeded.

Each test runs twice: `prefetch` (the worker's configuration) and `no-prefetch` (the publisher as it was before
commit 1631d8f: every flush reads the outbox itself). The `no-prefetch` runs pass, so each `prefetch` failure is
something the prefetch brought in, not an older behaviour of the publisher.

The writer is the real `Writer` thread. Where one job must land between two others, the test says how it forces
that order.

`_forget_sent`'s transaction failing (a DuckDB error inside it: I/O error, disk full) is emulated by making
`Outbox.replace_with_dead_letters` raise once inside the transaction. The transaction rolls back, the rows stay
in the file, and `deleted()` runs in the `finally`. Before the prefetch, those rows were simply due again: the next
flush's read found them, in sequence order with anything queued since.
"""

from __future__ import annotations

import asyncio

import pytest

from agents.stream.publisher import Publisher
from agents.stream.writer import Writer
from state.local_state import LocalState


class Producer:
    """Acknowledges every send at once, refuses keys in `refuse` for good, and remembers what it was given."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.values: dict[bytes, bytes] = {}  # the last value sent per key: what a compacted topic keeps
        self.refuse: set[bytes] = set()
        self.on_refuse = None

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append(key)
        self.values[key] = value
        if key in self.refuse:
            if self.on_refuse is not None:
                self.on_refuse(key)
            raise ValueError("the producer refuses this record for good")
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
    yield state, writer, app, Publisher(state, app, writer.run, lambda: {}, prefetching=request.param)
    writer.close()
    state.close()


def _apply_job(state: LocalState, publisher: Publisher, keys: list[bytes], value: bytes = b"v",
               standby: bool = False) -> None:
    """What `Replica._apply` does as far as the outbox goes: commit the batch's records, then `after_commit`."""
    with state.store.transaction():
        state.outbox.add_many([("out", key, value) for key in keys],
                              [("source-changes", 0, i) for i, _ in enumerate(keys)], standby=standby)
    if publisher.prefetched is not None:
        publisher.prefetched.read()


def _fail_forget_once(state: LocalState) -> None:
    """The next `_forget_sent` transaction fails (raises inside it, so it rolls back); later ones commit."""
    real = state.outbox.replace_with_dead_letters
    armed = [True]

    def failing(rows, why):
        if armed[0]:
            armed[0] = False
            raise RuntimeError("IO Error: could not write the file (emulated)")
        return real(rows, why)

    state.outbox.replace_with_dead_letters = failing


def _apply_job_before_forget(publisher: Publisher, writer: Writer, job) -> list[asyncio.Future]:
    """The replica's next apply job reaches the writer after the flush's read-on (`_pending(after)`, submitted as
    soon as `_forget_sent` is handed to `ensure_future`) and before that `_forget_sent` job. In a worker it does when
    the replica's task runs before the `forgetting` task first runs. The test forces it: the first `_forget_sent`
    call submits `job` first and lets it reach the writer's queue."""
    real = publisher.run_writes
    submitted: list[asyncio.Future] = []

    async def run(fn, *args, **kwargs):
        if not submitted and getattr(fn, "__name__", "") == "_forget_sent":
            submitted.append(asyncio.ensure_future(writer.run(job)))
            await asyncio.sleep(0)  # its task submits it to the writer
        return await real(fn, *args, **kwargs)

    publisher.run_writes = run
    return submitted


@pytest.mark.timeout(30)
async def test_a_failed_forget_lets_the_next_flush_send_a_plan_s_newer_record_before_its_older_one(world):
    """(1) A flush sends `K` v1 and a record the broker refuses. It marks both `leaving` and hands `_forget_sent`
    to the writer. An apply job that reaches the writer first queues `K` v2 and reads the outbox: it passes over v1
    (`leaving`). `_forget_sent`'s transaction then fails: v1 and the refused record stay in the file, and
    `deleted()` makes them due again. The read that skipped them is still `_last`. The flush its batch kicks takes it
    and sends v2 alone (nothing was queued since, so it is `complete` and nothing reads on). The next flush that reads
    the outbox itself (the 1 s timer) sends v1, so a compacted topic keeps v1. Without the prefetch, the flush after
    the failure read v1, the refused record and v2 in sequence order."""
    state, writer, app, publisher = world
    app.producer.refuse.add(b"bad")
    await writer.run(_apply_job, state, publisher, [b"K", b"bad"], b"v1")
    _fail_forget_once(state)
    next_batch = _apply_job_before_forget(
        publisher, writer, lambda: _apply_job(state, publisher, [b"K"], b"v2"))
    await publisher.publish()  # the flush v1's batch kicked: its `_forget_sent` fails (logged, rows stay queued)
    await next_batch[0]
    await publisher.publish()  # the flush v2's batch kicks (`publish_owned`)
    await publisher.publish()  # the timer's flush (`flush_outbox`)
    assert app.producer.values[b"K"] == b"v2", f"sent in this order: {app.producer.sent}"


@pytest.mark.timeout(30)
async def test_records_due_again_after_a_failed_forget_are_never_announced_by_the_next_batch(world):
    """(1)/(5) The same failure, with an apply job that queued only standby records (events of partitions this
    worker does not own). Its read finds nothing due: the acknowledged record and the refused one are `leaving`.
    Once `_forget_sent` has failed they are due again, but `publish_owned` trusts that read (`due()` is False, not
    None), so it kicks no flush. They wait for the 1 s timer, and the timer's first flush takes the same empty read
    and sends nothing. Before the prefetch, `publish_owned` asked `any_due` and kicked a flush at once."""
    state, writer, app, publisher = world
    app.producer.refuse.add(b"bad")
    await writer.run(_apply_job, state, publisher, [b"K", b"bad"], b"v1")
    _fail_forget_once(state)
    next_batch = _apply_job_before_forget(
        publisher, writer, lambda: _apply_job(state, publisher, [b"other-partition"], standby=True))
    await publisher.publish()
    await next_batch[0]
    before = len(app.producer.sent)
    await publisher.publish_owned([])  # the standby batch's `after_apply`: nothing of its own to promote
    for _ in range(50):
        if len(app.producer.sent) > before:
            break
        await asyncio.sleep(0.01)
    assert app.producer.sent[before:], "records due again after the failed forget were not sent at once"


@pytest.mark.timeout(30)
async def test_records_left_leaving_when_a_flush_stops_before_forgetting_them_are_skipped_by_prefetched_flushes(world):
    """(2) A flush's first `_forget_sent` fails. Its next round sends `K` v1 and a refused record, marks them
    `leaving`, then `await forgetting` (the failed job) raises before their own `_forget_sent` is submitted.
    Nothing ever calls `deleted()` for them. From then on every read made by an apply job passes over both: the
    refused record is never dead-lettered, and the acknowledged one is never deleted, while flushes go on using
    those reads. Five batches later both are still in the outbox and due. Only a flush that reads the outbox itself
    (in a worker, the 1 s timer's, when no read is waiting) sends them again, after the records queued since (see the
    first test for what that does to a key). Before the prefetch, the next flush's read found them, sent them again
    in sequence order and forgot them. The `leaving` entries are never removed."""
    state, writer, app, publisher = world
    app.producer.refuse.update({b"bad1", b"bad2"})
    await writer.run(_apply_job, state, publisher, [b"a", b"bad1"])
    _fail_forget_once(state)
    next_batch: list[asyncio.Future] = []

    def next_apply_job(key):  # the replica's next batch reaches the writer while round 1 awaits its acks
        if key == b"bad1":
            next_batch.append(asyncio.ensure_future(
                writer.run(_apply_job, state, publisher, [b"K", b"bad2"], b"v1")))

    app.producer.on_refuse = next_apply_job
    await publisher.publish()  # round 1: bad1 refused, its forget fails; round 2: K v1 sent, bad2 refused; raises
    await next_batch[0]
    assert app.producer.sent == [b"a", b"bad1", b"K", b"bad2"]  # the interleaving meant
    for i in range(5):  # a stream goes on: each batch queues a record and kicks a flush
        await writer.run(_apply_job, state, publisher, [b"s%d" % i])
        await publisher.publish()
    left = await writer.run(lambda: state.outbox.pending(100, None))
    assert left == [], f"still due after 5 flushes: {[(seq, key) for seq, _, key, _ in left]}"
