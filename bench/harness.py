"""Start freshplan workers and helper processes for benchmarks, on the embedded broker."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from agents.cli.loader import publish
from bench.stats import exposition
from schemas.freshness import decode_token
from streams.broker import free_port
from streams.processes import end_process
from streams.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PORT_ATTEMPTS = 3
"""Starts of a worker whose HTTP port another process took before it could bind it."""


@dataclass
class BenchWorker:
    """A `freshplan run` subprocess on its own topics and group."""

    settings: Settings
    bootstrap: str
    url: str
    proc: subprocess.Popen
    log_path: Path
    http: aiohttp.ClientSession = field(repr=False)
    env: dict = field(default_factory=dict, repr=False)

    @property
    def auth(self) -> dict[str, str]:
        """The bearer header for the secret this worker was started with."""
        return {"Authorization": f"Bearer {self.settings.token}"}

    async def publish(self, records) -> str:
        """Publish (topic, key, value) records; the freshness token covering them."""
        return await publish(self.settings, self.bootstrap, records)

    async def select(self, body: dict, fresh: str | None = None, wait_for_owner: float = 0.0) -> dict:
        """POST /v1/select; raise on anything but 200.

        With `wait_for_owner`, a 503 (the owner is moving in a rebalance) is retried after the
        answer's `retry_after` for up to that many seconds.
        """
        if fresh:
            body = dict(body, at_least_as_fresh=fresh)
        deadline = asyncio.get_running_loop().time() + wait_for_owner
        while True:
            async with self.http.post(f"{self.url}/v1/select", json=body, headers=self.auth) as resp:
                doc = await resp.json()
            if resp.status == 200:
                return doc
            pause = float((doc.get("error") or {}).get("retry_after") or 1)
            if resp.status != 503 or asyncio.get_running_loop().time() + pause > deadline:
                raise RuntimeError(f"select failed with {resp.status}: {doc}")
            await asyncio.sleep(pause)

    async def health(self) -> dict:
        """GET /healthz."""
        async with self.http.get(f"{self.url}/healthz", headers=self.auth) as resp:
            return await resp.json()

    async def metrics(self) -> dict[str, float]:
        """GET /metrics as {series: value}."""
        async with self.http.get(f"{self.url}/metrics", headers=self.auth) as resp:
            return exposition(await resp.text())

    async def consumers(self, topic: str, action: str) -> None:
        """Pause or resume applying an input topic."""
        async with self.http.post(f"{self.url}/v1/admin/consumers", json={"topic": topic, "action": action},
                                  headers=self.auth) as r:
            if r.status != 200:
                raise RuntimeError(await r.text())

    async def caught_up(self, token: str, poll: float = 0.02, timeout: float = 900.0) -> dict:
        """Wait until everything up to `token` is applied and every record it caused is published."""
        target = decode_token(token)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            health = await self.health()
            applied = health["applied_offsets"]
            done = all(applied.get(t, {}).get(str(p), applied.get(t, {}).get(p, 0)) >= o
                       for t, parts in target.items() for p, o in parts.items())
            if done and health["outbox"] == 0 and health["standby_outbox"] == 0:
                return health
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"worker not caught up within {timeout}s: {health['lag']}")
            await asyncio.sleep(poll)

    async def restart(self) -> None:
        """Start a new process on the same topics, group and state (on another port if its own was taken)."""
        spawned_at = _log_size(self.log_path)
        self.proc = _spawn(self.env, self.log_path)
        await _started(self, spawned_at)

    def move_to(self, port: int) -> None:
        """Serve HTTP on another port from the next start on."""
        self.env["FRESHPLAN_WEB_PORT"] = str(port)
        self.settings = Settings.from_env(self.env)
        self.url = f"http://127.0.0.1:{port}"

    def pin(self, cpus: set[int] | None) -> bool:
        """Pin every thread of the worker to `cpus` (None: every core this process may use); False if refused."""
        return pin(self.proc.pid, cpus)

    def kill9(self) -> None:
        """SIGKILL: no shutdown, no commit, no goodbye to the group."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM and wait."""
        end_process(self.proc)


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user and system, every thread) a process has used so far; None where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def pin(pid: int, cpus: set[int] | None) -> bool:
    """Set the CPU affinity of every thread of `pid`; threads started later inherit the main thread's."""
    cpus = cpus if cpus is not None else os.sched_getaffinity(0)
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except ProcessLookupError:
                pass  # a thread that ended meanwhile
        return True
    except (OSError, AttributeError):
        return False


async def start_worker(bootstrap: str, directory: Path, http: aiohttp.ClientSession, tag: str | None = None,
                       **extra: str) -> BenchWorker:
    """A worker with the wall clock off; returns once its HTTP API is ready.

    Workers started with the same `tag` share topics and consumer group (a cluster); without one
    the worker gets fresh topics of its own.
    """
    tag = tag or uuid.uuid4().hex[:8]
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=bootstrap, FRESHPLAN_TOPIC_PREFIX=f"bench{tag}-",
               FRESHPLAN_APP_ID=f"bench-{tag}", FRESHPLAN_STATE_DIR=str(directory / "state"),
               FRESHPLAN_WEB_PORT=str(port), FRESHPLAN_WALL_CLOCK="0", FRESHPLAN_FRESHNESS_WAIT="600",
               FRESHPLAN_LOG_LEVEL="warning", FRESHPLAN_PARTITIONS="4", FRESHPLAN_REVOCATION_LAG_BOUND="3600",
               FRESHPLAN_TOKEN=secrets.token_urlsafe(32))
    env.update(extra)  # a cluster passes one shared FRESHPLAN_TOKEN
    log_path = directory / "worker.log"
    spawned_at = _log_size(log_path)
    proc = _spawn(env, log_path)
    url = f"http://127.0.0.1:{env['FRESHPLAN_WEB_PORT']}"
    worker = BenchWorker(Settings.from_env(env), bootstrap, url, proc, log_path, http, env)
    await _started(worker, spawned_at)
    return worker


def _spawn(env: dict, log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "agents.cli", "run"], env=env, cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT)


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class PortTaken(RuntimeError):
    """The worker could not bind its HTTP port: another process holds it."""


async def _started(worker: BenchWorker, spawned_at: int) -> None:
    """Wait until `worker` is ready; if its port was taken, start it on another one (a few times).

    `free_port` releases the port before the worker binds it, and meanwhile any outgoing
    connection on the machine may be given it as its local port: with several workers and
    their Kafka clients starting at once, that happens.
    """
    for attempt in range(PORT_ATTEMPTS):
        try:
            await _ready(worker, spawned_at)
            return
        except PortTaken:
            if attempt + 1 == PORT_ATTEMPTS:
                raise
        worker.move_to(free_port())
        spawned_at = _log_size(worker.log_path)
        worker.proc = _spawn(worker.env, worker.log_path)


def _port_taken(log_path: Path, since: int) -> bool:
    with open(log_path, "rb") as log:
        log.seek(since)
        return b"address already in use" in log.read()


async def _ready(worker: BenchWorker, spawned_at: int | None = None) -> None:
    """Wait until the worker answers /healthz with its revocations ok; from `spawned_at` on its log is watched for
    a port it could not bind."""
    deadline = asyncio.get_running_loop().time() + 90
    while True:
        try:
            if (await worker.health())["revocations"]["state"] == "ok":
                return
        except aiohttp.ClientError:
            pass
        # Faust logs a port it cannot bind and may take a long while to exit after it.
        if spawned_at is not None and _port_taken(worker.log_path, spawned_at):
            worker.stop()
            raise PortTaken(f"port of {worker.url} taken; see {worker.log_path}")
        if worker.proc.poll() is not None:
            raise RuntimeError(f"worker exited with {worker.proc.returncode}; see {worker.log_path}")
        if asyncio.get_running_loop().time() > deadline:
            worker.stop()
            raise RuntimeError(f"worker did not start within 90s; see {worker.log_path}")
        await asyncio.sleep(0.1)


async def run_ceiling(bootstrap: str, topics: list[str], expect: int, directory: Path, session_timeout: float) -> dict:
    """The bare Faust agent over the same topics; events/s from its first to its last batch."""
    out = directory / f"ceiling-{uuid.uuid4().hex[:6]}.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.faust_ceiling", "--bootstrap", bootstrap, "--topics", ",".join(topics),
        "--expect", str(expect), "--group", f"ceiling-{uuid.uuid4().hex[:6]}", "--out", str(out),
        "--session-timeout", f"{session_timeout:g}", cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        await asyncio.wait_for(proc.wait(), 300)
    except asyncio.TimeoutError:
        proc.kill()
        raise RuntimeError("the Faust ceiling did not consume the workload within 300s") from None
    import json

    result = json.loads(out.read_text())
    return {"events": result["count"], "seconds": round(result["seconds"], 4),
            "events_per_second": round(result["count"] / result["seconds"]) if result["seconds"] else None}
