"""A bare relay as a Faust agent (group consumer, `take_events`, the app's producer): what Faust adds to a hop.

`relay` runs it in a subprocess beside the bench's own sender and reader, as `bench.relay` runs the bare
aiokafka relay, so the two latencies come from one run on one broker. With `--fetch-wait-ms` the group
consumer's fetch wait is set in code (`streams.fetch_wait`); without it, Faust's hard-coded 1.5 s stays.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.relay import _read, _send_at_rate, relay_topics
from bench.stats import percentiles
from streams.admin import producer, stop_within
from streams.settings import EMBEDDED_SESSION_TIMEOUT

ROOT = Path(__file__).resolve().parent.parent


async def relay(bootstrap: str, kafka: dict[str, Any], rate: float, events: int, fetch_wait_ms: int | None,
                partitions: int = 2, timeout: float = 60.0, session_timeout: float = EMBEDDED_SESSION_TIMEOUT) -> dict:
    """Latency from the sender's send to the reader reading what the Faust agent passed on (p50/p99 ms)."""
    inbound, outbound = await relay_topics(bootstrap, kafka, "bench-frelay", partitions)
    tag = inbound.rsplit("-", 1)[1]
    command = [sys.executable, "-m", "bench.faust_relay", "--bootstrap", bootstrap, "--inbound", inbound,
               "--outbound", outbound, "--group", f"bench-frelay-{tag}", "--session-timeout", f"{session_timeout:g}"]
    if fetch_wait_ms is not None:
        command += ["--fetch-wait-ms", str(fetch_wait_ms)]
    with tempfile.TemporaryFile() as log:
        agent = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10,
                                  **kafka)
        send = producer(bootstrap, kafka)
        seen: dict[bytes, float] = {}
        task = None
        try:
            await reader.start()
            await send.start()
            tps = [TopicPartition(outbound, p) for p in range(partitions)]
            reader.assign(tps)
            for tp in tps:
                reader.seek(tp, 0)
            task = asyncio.create_task(_read(reader, seen))
            await _joined(send, inbound, seen, agent, timeout)
            sent = await _send_at_rate(send, inbound, rate, events)
            deadline = time.monotonic() + 30
            while len([v for v in sent if v in seen]) < len(sent) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            waits = [seen[value] - at for value, at in sent.items() if value in seen]
            return dict(percentiles(waits), events=len(sent), lost=len(sent) - len(waits),
                        fetch_wait_ms=1500 if fetch_wait_ms is None else fetch_wait_ms)
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            agent.kill()
            agent.wait(timeout=20)
            for client in (reader, send):
                await stop_within(client)


async def _joined(send, inbound: str, seen: dict[bytes, float], agent: subprocess.Popen, timeout: float) -> None:
    """Send warm-up records until one comes back: the agent's group has its partitions."""
    deadline = time.monotonic() + timeout
    n = 0
    while not any(v.startswith(b"warm-") for v in seen):
        if agent.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the Faust relay did not pass a record on within {timeout:g} s")
        await send.send_and_wait(inbound, b"warm-%d" % n, key=b"hot")
        n += 1
        await asyncio.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--inbound", required=True)
    parser.add_argument("--outbound", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--fetch-wait-ms", type=int, default=None)
    parser.add_argument("--session-timeout", type=float, default=EMBEDDED_SESSION_TIMEOUT)
    args = parser.parse_args()

    import faust

    from bench.faust_ceiling import baseline_group
    from streams.fetch_wait import set_fetch_wait

    if args.fetch_wait_ms is not None:
        set_fetch_wait(args.fetch_wait_ms)
    app = faust.App(args.group, broker=f"kafka://{args.bootstrap}", store="memory://", autodiscover=False,
                    web_enabled=False, consumer_auto_offset_reset="latest", topic_allow_declare=False,
                    broker_rebalance_timeout=3.0, **baseline_group(args.session_timeout), producer_linger_ms=0,
                    datadir=tempfile.mkdtemp(prefix="fpbench-frelay-"))
    inbound = app.topic(args.inbound, key_serializer="raw", value_serializer="raw")
    outbound = app.topic(args.outbound, key_serializer="raw", value_serializer="raw")

    @app.agent(inbound)
    async def pass_on(stream):
        # The worker's batching (a window of 5 ms here), then the batch's sends gathered.
        async for events in stream.take_events(500, within=0.005):
            await asyncio.gather(*[await outbound.send(key=e.message.key, value=e.message.value) for e in events])

    faust.Worker(app, loglevel="warning", override_logging=False).execute_from_commandline()


if __name__ == "__main__":
    main()
