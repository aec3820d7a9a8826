"""The publisher: the replica's batches are published in the background, every promoted record exactly once."""

from __future__ import annotations

import asyncio

import pytest

from agents.event_apply import RawMessage
from agents.publisher import Publisher
from agents.writer import inline
from state.local_state import LocalState


class SlowProducer:
    """Accepts sends at once and acknowledges them only when the test says so."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.acks: list[asyncio.Future] = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append(value)
        self.acks.append(asyncio.get_running_loop().create_future())
        return self.acks[-1]

    def ack_all(self) -> None:
        for ack in self.acks:
            if not ack.done():
                ack.set_result(None)


class App:
    def __init__(self) -> None:
        self.producer = SlowProducer()


@pytest.fixture
def setup(tmp_path):
    state = LocalState.open(tmp_path / "f.duckdb")
    app = App()
    yield state, app, Publisher(state, app, inline, lambda: {"source-changes": [0]})
    state.close()


def _caused(state: LocalState, offset: int) -> RawMessage:
    """A standby record caused by the event at this offset, and that event."""
    with state.store.transaction():
        state.outbox.add_many([("out", b"k", f"caused-by-{offset}".encode())], [("source-changes", 0, offset)],
                              standby=True)
    return RawMessage("source-changes", 0, offset, b"k", b"{}")


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.001)


@pytest.mark.timeout(10)
async def test_the_replica_does_not_wait_for_acknowledgements(setup):
    state, app, publisher = setup
    await asyncio.wait_for(publisher.publish_owned([_caused(state, 0)]), 1)  # returns with the ack still due
    await _until(lambda: app.producer.sent)
    assert state.outbox.size() == 1  # kept until acknowledged
    # Promoted while the first flush waits: the same flush task reads the outbox again for it.
    await publisher.publish_owned([_caused(state, 1)])
    app.producer.ack_all()
    await _until(lambda: len(app.producer.sent) == 2)
    app.producer.ack_all()
    await _until(lambda: state.outbox.size() == 0)
    await publisher._flushing
    assert app.producer.sent == [b"caused-by-0", b"caused-by-1"]


@pytest.mark.timeout(10)
async def test_a_partition_this_worker_does_not_own_stays_on_standby(setup):
    state, app, publisher = setup
    message = _caused(state, 0)
    await publisher.publish_owned([RawMessage("source-changes", 1, 0, b"k", b"{}")])
    assert publisher._flushing is None and state.outbox.standby_size() == 1
    await publisher.publish_owned([message])
    await _until(lambda: app.producer.sent)
    app.producer.ack_all()
    await publisher._flushing
    assert state.outbox.size() == 0 and state.outbox.standby_size() == 0
