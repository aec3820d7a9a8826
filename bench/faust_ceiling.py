"""A bare Faust agent that only consumes the input topics: what Faust and this machine allow at all.

Run by `freshplan bench` as a subprocess; writes {"count", "seconds"} (first to last event) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import faust

from streams.app import UnpausedTableManager
from streams.settings import EMBEDDED_SESSION_TIMEOUT, heartbeat_interval


def baseline_group(session_timeout: float) -> dict:
    """The group settings of the workers a bare Faust agent is compared with (the bench's session timeout: 4 s on
    the embedded broker, 6 s on Apache Kafka, which refuses less). They change only how soon it starts (Tansu holds
    a JoinGroup for half the session timeout; Faust's table manager pauses a second, for tables it has none of),
    and its start is not in what is timed."""
    return {"broker_session_timeout": session_timeout,
            "broker_heartbeat_interval": heartbeat_interval(session_timeout),
            "TableManager": UnpausedTableManager}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topics", required=True, help="comma-separated broker-side topic names")
    parser.add_argument("--expect", type=int, required=True, help="events to consume before reporting")
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--session-timeout", type=float, default=EMBEDDED_SESSION_TIMEOUT)
    args = parser.parse_args()

    app = faust.App(args.group, broker=f"kafka://{args.bootstrap}", store="memory://", autodiscover=False,
                    web_enabled=False, consumer_auto_offset_reset="earliest", topic_allow_declare=False,
                    broker_rebalance_timeout=3.0, **baseline_group(args.session_timeout),
                    datadir=tempfile.mkdtemp(prefix="fpbench-ceiling-"))
    topic = app.topic(*args.topics.split(","), key_serializer="raw", value_serializer="raw")
    seen = {"n": 0, "first": None, "first_batch": 0}

    @app.agent(topic)
    async def consume(stream):
        # The same batching as freshplan's agents, and nothing else.
        async for events in stream.take_events(args.batch_size, within=0.05):
            now = time.perf_counter()
            if seen["first"] is None:  # the clock starts after the first batch: count what follows
                seen["first"], seen["first_batch"] = now, len(events)
            seen["n"] += len(events)
            if seen["n"] >= args.expect:
                with open(args.out, "w") as out:
                    json.dump({"count": seen["n"] - seen["first_batch"], "seconds": now - seen["first"]}, out)
                os._exit(0)

    faust.Worker(app, loglevel="warning", override_logging=False).execute_from_commandline()


if __name__ == "__main__":
    main()
