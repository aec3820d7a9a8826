"""Faust's group consumer gets the fetch wait set in code, not its hard-coded 1.5 s."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

# In a process of its own: a Faust app builds an event loop and sockets the suite would flag as unclosed.
PROBE = """
import asyncio, sys, tempfile
import faust
from streams import fetch_wait

async def main():
    if len(sys.argv) > 1:
        fetch_wait.set_fetch_wait(int(sys.argv[1]))
    app = faust.App("fetch-wait-probe", broker="kafka://127.0.0.1:9", store="memory://", autodiscover=False,
                    web_enabled=False, datadir=tempfile.mkdtemp())
    consumer = app.consumer._thread._create_worker_consumer(app.transport)
    print(consumer._fetch_max_wait_ms, fetch_wait.fetch_wait())
    await consumer.stop()

asyncio.run(main())
"""


@pytest.mark.parametrize("args, shown", [([], "1500 1500"), (["7"], "7 7")])
def test_a_group_consumer_waits_what_the_process_set(args, shown):
    out = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == shown


def test_a_negative_wait_is_refused():
    from streams.fetch_wait import set_fetch_wait

    with pytest.raises(ValueError):
        set_fetch_wait(-1)
