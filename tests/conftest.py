"""Shared fixtures: one embedded broker per session, one worker process per broker test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.cli.loader import publish, read_scenario
from agents.web.token_keys import TokenKeys
from tests.agents.applier_kit import setup  # noqa: F401 - the `setup` fixture, for every test that asks for it
from schemas.freshness import encode_token, read_token
from streams.broker import EmbeddedBroker, free_port
from streams.processes import end_process
from streams.settings import EMBEDDED_SESSION_TIMEOUT, Settings

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
ATLAS_REQUEST = orjson.loads((SCENARIOS / "atlas-request.json").read_bytes())


_TOKEN_KEYS: list[Path] = []


def token_key_file() -> Path:
    """One token key file per test process, shared by every worker `launch` starts (as a group's workers share one)."""
    if not _TOKEN_KEYS:
        directory = Path(tempfile.mkdtemp(prefix="freshplan-keys-"))
        _TOKEN_KEYS.append(TokenKeys(directory / "token-keys.json").ensure().path)
    return _TOKEN_KEYS[0]


def accepted_keys() -> tuple[bytes, ...]:
    """The keys `launch`'s workers accept now (to read their tokens in a test)."""
    return TokenKeys(token_key_file()).ensure().accepted()


def sign_token(offsets: dict[str, dict[int, int]], cluster: str | None, epoch: int | None = None,
               key_file: Path | None = None) -> str:
    """A token as the workers sign it (with the test process's key file unless another is named)."""
    keys = TokenKeys(key_file or token_key_file())
    keys.load()
    return encode_token(offsets, cluster, epoch, key=keys.sign_with())


def freshest(*tokens: str) -> str:
    """One token covering all of `tokens`: each publish's token names only the partitions it wrote to."""
    merged: dict[str, dict[int, int]] = {}
    clusters = set()
    for token in tokens:
        decoded = read_token(token, accepted_keys())
        clusters.add(decoded.cluster_id)
        for topic, parts in decoded.offsets.items():
            for partition, offset in parts.items():
                here = merged.setdefault(topic, {})
                here[partition] = max(here.get(partition, 0), offset)
    [cluster] = clusters  # tokens of one broker incarnation only
    return sign_token(merged, cluster)


@pytest.fixture(scope="session")
def broker():
    """The embedded Tansu broker, started by the project's own code."""
    with EmbeddedBroker() as running:
        yield running


@dataclass
class WorkerProcess:
    """A `freshplan run` subprocess with its own topics, group and state directory."""

    settings: Settings
    bootstrap: str
    url: str
    proc: subprocess.Popen
    log_path: Path
    http: aiohttp.ClientSession | None = field(default=None, repr=False)
    env: dict = field(default_factory=dict, repr=False)
    # Workers started beside this one (start_peer): `launch` ends them even when a test fails before its own cleanup.
    peers: list["WorkerProcess"] = field(default_factory=list, repr=False)

    @property
    def auth(self) -> dict[str, str]:
        """The bearer header for the secret the worker was started with (FRESHPLAN_TOKEN)."""
        return auth_header(self.env)

    def stop(self) -> None:
        """SIGTERM the worker and wait for a clean exit."""
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        """SIGKILL the worker: no shutdown hooks, no flushing."""
        self.proc.kill()
        self.proc.wait(timeout=20)

    async def restart(self) -> None:
        """Start a new process on the same topics, group and state directory."""
        self.proc = _spawn(self.env, self.log_path)
        await _wait_http(self.url, self.proc, self.log_path)

    async def publish(self, records: list[tuple[str, bytes | None, bytes]]) -> str:
        """Publish (topic, key, value) records; return the freshness token covering them."""
        return await publish(self.settings, self.bootstrap, records)

    async def publish_events(self, *items: tuple[str, dict]) -> str:
        """Publish (topic, event) pairs with the design's keys."""
        lines = "\n".join(orjson.dumps({"topic": t, "event": e}).decode() for t, e in items)
        path = self.log_path.parent / f"events-{uuid.uuid4().hex[:6]}.jsonl"
        path.write_text(lines)
        return await self.publish(read_scenario(path))

    async def load(self, name: str) -> str:
        """Publish a scenario file from scenarios/."""
        return await self.publish(read_scenario(SCENARIOS / name))

    async def select(self, body: dict, fresh: str | None = None, expect: int = 200) -> dict:
        """POST /v1/select and check the status."""
        if fresh:
            body = dict(body, at_least_as_fresh=fresh)
        async with self.http.post(f"{self.url}/v1/select", json=body) as resp:
            doc = await resp.json()
            assert resp.status == expect, doc
            return doc

    async def get(self, path: str, expect: int = 200) -> dict:
        """GET a route and check the status."""
        async with self.http.get(f"{self.url}{path}") as resp:
            doc = await resp.json()
            assert resp.status == expect, doc
            return doc

    async def everything(self, topic: str) -> list[dict]:
        """Every record on a topic right now, from the beginning."""
        return await asyncio.wait_for(_drain(self.bootstrap, self.settings.topic(topic), self.settings.partitions), 30)

    async def records(self, topic: str, until, timeout: float = 30.0) -> list[dict]:
        """Read a topic from the beginning until `until(records)` is true; fail after `timeout`."""
        consumer = await read_from_start(self.bootstrap, self.settings.topic(topic), self.settings.partitions)
        seen: list[dict] = []
        try:
            async def read() -> None:
                while not until(seen):
                    batch = await consumer.getmany(timeout_ms=200)
                    for messages in batch.values():
                        seen.extend(dict(orjson.loads(m.value), _key=m.key) for m in messages)

            await asyncio.wait_for(read(), timeout)
            return seen
        except asyncio.TimeoutError:
            raise AssertionError(f"condition on {topic} not met within {timeout}s; saw {seen}") from None
        finally:
            await consumer.stop()


async def eventually(check, timeout: float = 60.0, what: str = "condition"):
    """Await `check()` every 0.2 s until it returns something true (returned), or fail after `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.2)


async def start_peer(first: WorkerProcess, directory: Path) -> WorkerProcess:
    """A second worker on the same topics and consumer group, with its own state and port."""
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    env = dict(first.env, FRESHPLAN_STATE_DIR=str(directory / "state"), FRESHPLAN_WEB_PORT=str(port))
    log_path = directory / "worker.log"
    url = f"http://127.0.0.1:{port}"
    peer = WorkerProcess(first.settings, first.bootstrap, url, _spawn(env, log_path), log_path, http=first.http,
                         env=env)
    first.peers.append(peer)
    await _wait_http(url, peer.proc, log_path)
    return peer


async def read_from_start(bootstrap: str, name: str, partitions: int) -> AIOKafkaConsumer:
    """A started consumer (no group) assigned every partition of the topic `name`, at its start; the caller stops it."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(name, p) for p in range(partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
    except BaseException:
        await consumer.stop()
        raise
    return consumer


async def _drain(bootstrap: str, name: str, partitions: int) -> list[dict]:
    consumer = await read_from_start(bootstrap, name, partitions)
    try:
        ends = await consumer.end_offsets(list(consumer.assignment()))
        seen: list[dict] = []
        async def behind() -> bool:
            return any([await consumer.position(tp) < end for tp, end in ends.items()])

        while await behind():
            batch = await consumer.getmany(timeout_ms=200)
            for tp, messages in batch.items():  # a tombstone is its key and partition only
                seen.extend(dict(orjson.loads(m.value) if m.value is not None else {"_tombstone": True},
                                 _key=m.key, _partition=tp.partition) for m in messages)
        return seen
    finally:
        await consumer.stop()


def auth_header(env: dict) -> dict[str, str]:
    """`Authorization: Bearer` with the FRESHPLAN_TOKEN of a worker's environment."""
    return {"Authorization": f"Bearer {env['FRESHPLAN_TOKEN']}"}


async def _wait_http(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 60.0) -> None:
    """Until /readyz says 200: the HTTP API is up and revocations are known and within the bound."""
    async with aiohttp.ClientSession() as http:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                async with http.get(f"{url}/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"worker HTTP not up within {timeout}s:\n{log_path.read_text()[-4000:]}")


def _spawn(env: dict, log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "agents.cli", "run"], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)


async def _end_all(procs: list[subprocess.Popen]) -> None:
    """Stop the workers at once, each waited for on a thread: the test's loop keeps running meanwhile (a broker
    relay on it must pass on what they send as they leave), and none takes over what another is giving up."""
    ends = asyncio.gather(*(asyncio.to_thread(end_process, proc, 20) for proc in procs))
    try:
        await asyncio.shield(ends)
    except asyncio.CancelledError:  # a timed-out test still leaves no worker running
        for proc in procs:
            end_process(proc, timeout=20)
        raise


@contextlib.asynccontextmanager
async def launch(broker, directory: Path, wait: bool = True, **extra: str):
    """A worker process on unique topics and group, with the wall clock off (scenarios drive time).

    `extra` adds environment variables; the worker's secret is FRESHPLAN_TOKEN, sent by `http`.
    With wait=False it yields as soon as the process is spawned (`http` is then set as well).
    """
    tag = uuid.uuid4().hex[:8]
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers,
               FRESHPLAN_TOPIC_PREFIX=f"t{tag}-", FRESHPLAN_APP_ID=f"freshplan-{tag}",
               FRESHPLAN_STATE_DIR=str(directory / "state"), FRESHPLAN_WEB_PORT=str(port),
               FRESHPLAN_WALL_CLOCK="0", FRESHPLAN_PARTITIONS="2", FRESHPLAN_FRESHNESS_WAIT="10",
               FRESHPLAN_REVOCATION_LAG_BOUND="3", FRESHPLAN_TOKEN=secrets.token_urlsafe(32),
               FRESHPLAN_CHECK_HEAD_CACHE="1", FRESHPLAN_TOKEN_KEY_FILE=str(token_key_file()),
               # What `run` uses on the embedded broker it starts itself (the one here is started by the suite).
               FRESHPLAN_SESSION_TIMEOUT=f"{EMBEDDED_SESSION_TIMEOUT:g}")
    env.update(extra)
    settings = Settings.from_env(env)
    log_path = directory / "worker.log"
    url = f"http://127.0.0.1:{port}"
    running = WorkerProcess(settings, broker.bootstrap_servers, url, _spawn(env, log_path), log_path, env=env)
    try:
        if wait:
            await _wait_http(url, running.proc, log_path)
        async with aiohttp.ClientSession(headers=running.auth) as http:
            running.http = http
            yield running
    finally:
        await _end_all([peer.proc for peer in running.peers] + [running.proc])
        # Every worker here compares its in-memory select hits with the file (FRESHPLAN_CHECK_HEAD_CACHE).
        if log_path.exists() and b"head cache disagrees" in log_path.read_bytes():
            raise AssertionError(f"the head cache disagreed with the state file; see {log_path}")


@pytest.fixture
async def worker(broker, tmp_path):
    """A worker process on unique topics and group, with the wall clock off (scenarios drive time)."""
    async with launch(broker, tmp_path) as running:
        yield running
