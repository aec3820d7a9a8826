"""Keep a local plan cache coherent with a running freshplan, and print what changes.

Run next to `freshplan run` (same directory):  .venv/bin/python examples/cache_subscriber.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streams.kafka_security import KafkaSecurity  # noqa: E402
from streams.plan_cache import PlanCache  # noqa: E402


async def main(args: argparse.Namespace) -> None:
    info = json.loads((Path(args.state_dir) / "run.json").read_text()) if not args.bootstrap else {}
    bootstrap = args.bootstrap or info["bootstrap_servers"]
    cache = PlanCache(bootstrap, group_id=args.group, path=args.cache_file,
                      topic_prefix=args.topic_prefix or info.get("topic_prefix", ""),
                      kafka=KafkaSecurity.from_env(dict(os.environ)).client_kwargs())  # the KAFKA_* security settings
    await cache.start()
    deadline = time.monotonic() + args.max_seconds if args.max_seconds else None
    try:
        while deadline is None or time.monotonic() < deadline:
            if await cache.poll():
                plans = cache.db.execute("SELECT count(*) FROM plans").fetchone()[0]
                gone = cache.db.execute("SELECT count(*) FROM invalidated").fetchone()[0]
                print(json.dumps({"plans_known": plans, "invalidated": gone, "duplicates": cache.duplicates}),
                      flush=True)
    finally:
        await cache.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", default=".freshplan", help="where `freshplan run` wrote run.json")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: the local run's broker)")
    parser.add_argument("--topic-prefix", help="topic prefix (default: the local run's)")
    parser.add_argument("--group", default="plan-cache-example", help="consumer group (offsets survive restarts)")
    parser.add_argument("--cache-file", default="plan-cache.sqlite", help="local cache file")
    parser.add_argument("--max-seconds", type=float, default=0, help="stop after this long (0: run until Ctrl-C)")
    asyncio.run(main(parser.parse_args()))
