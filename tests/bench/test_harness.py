"""The bench's workers: one whose HTTP port was taken before it bound it is started again on another."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from bench.harness import start_worker


@pytest.mark.timeout(180)
async def test_a_worker_whose_port_is_taken_starts_on_another_port(broker, tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # bound, not listening: as an outgoing connection's local port would be
        taken = holder.getsockname()[1]
        async with aiohttp.ClientSession() as http:
            worker = await start_worker(broker.bootstrap_servers, tmp_path / "w", http,
                                        FRESHPLAN_WEB_PORT=str(taken))
            try:
                assert not worker.url.endswith(f":{taken}") and worker.env["FRESHPLAN_WEB_PORT"] != str(taken)
                assert (await worker.health())["status"] == "ok"
                assert b"address already in use" in worker.log_path.read_bytes()  # the first start did fail
            finally:
                worker.stop()
