"""Service settings: one immutable record, read from the environment once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

INPUT_TOPICS = ("source-changes", "policy-versions", "revocations", "clock")
OUTPUT_TOPICS = ("plan-invalidations", "plans", "receipts", "dead-letters")


@dataclass(frozen=True)
class Settings:
    """Everything a freshplan process needs to know; injected, never read from globals."""

    bootstrap_servers: str | None = None
    """Kafka `host:port[,host:port]`; None means start the embedded broker."""
    app_id: str = "freshplan"
    """Faust application id: the consumer group and the changelog prefix."""
    topic_prefix: str = ""
    """Prepended to every topic name, so that tests and tenants can share a broker."""
    partitions: int = 4
    """Partition count of every topic the service creates (equal for co-partitioning)."""
    state_dir: Path = field(default_factory=lambda: Path(".freshplan"))
    """Directory holding the DuckDB file, Faust's data dir and the run file."""
    web_host: str = "127.0.0.1"
    """Interface the HTTP API binds to."""
    web_port: int = 6066
    """Port of the HTTP API."""
    wall_clock: bool = True
    """Publish clock ticks from wall time (for deployments without a clock producer)."""
    wall_clock_interval: float = 1.0
    """Seconds between wall-clock ticks."""
    batch_size: int = 500
    """Most events one agent applies in one DuckDB transaction."""
    batch_window: float = 0.05
    """Seconds an agent waits to fill a batch before applying what it has."""
    freshness_wait: float = 5.0
    """Longest a select waits for `at_least_as_fresh` before refusing."""
    revocation_lag_bound: float = 5.0
    """Seconds behind on revocations beyond which no plan is served (HTTP 503)."""
    eager_recompile_limit: int = 500
    """Plans one batch recompiles before announcing; larger fan-outs are announced first."""
    max_event_bytes: int = 1_000_000
    """Events larger than this are dead-lettered unread."""
    max_record_bytes: int = 1_000_000
    """Largest record the service publishes (the producer's max request size); larger plans go out compact."""
    session_timeout: float = 10.0
    """Seconds without heartbeats before the group drops a worker."""
    rebalance_timeout: float = 3.0
    """Seconds the broker waits for members to rejoin; also bounds a cold start's first join."""
    log_level: str = "info"
    """Logging level of the worker."""
    log_format: str = "auto"
    """auto (short text lines on a terminal, JSON otherwise), json (one object per line) or text."""
    rebase: bool = False
    """Accept input topics that were reset (new broker or recreated topics): re-read them from their start."""

    @property
    def db_path(self) -> Path:
        """The DuckDB file with catalog, index, plans and offsets."""
        return self.state_dir / "freshplan.duckdb"

    @property
    def run_file(self) -> Path:
        """Where `freshplan run` records the broker and HTTP addresses it uses."""
        return self.state_dir / "run.json"

    def topic(self, name: str) -> str:
        """The broker-side name of one of the design's topics."""
        return f"{self.topic_prefix}{name}"

    def with_overrides(self, **changes: object) -> "Settings":
        """A copy with the given fields replaced (None values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        """Build settings from `FRESHPLAN_*` and `KAFKA_BOOTSTRAP_SERVERS` variables."""
        env = dict(os.environ if env is None else env)
        base = cls()

        def get(name: str, default: object, cast=str):
            raw = env.get(f"FRESHPLAN_{name}")
            if raw is None or raw == "":
                return default
            if cast is bool:
                return raw.strip().lower() in {"1", "true", "yes", "on"}
            return cast(raw)

        return cls(
            bootstrap_servers=env.get("KAFKA_BOOTSTRAP_SERVERS") or None,
            app_id=get("APP_ID", base.app_id),
            topic_prefix=get("TOPIC_PREFIX", base.topic_prefix),
            partitions=get("PARTITIONS", base.partitions, int),
            state_dir=Path(get("STATE_DIR", base.state_dir)),
            web_host=get("WEB_HOST", base.web_host),
            web_port=get("WEB_PORT", base.web_port, int),
            wall_clock=get("WALL_CLOCK", base.wall_clock, bool),
            wall_clock_interval=get("WALL_CLOCK_INTERVAL", base.wall_clock_interval, float),
            batch_size=get("BATCH_SIZE", base.batch_size, int),
            batch_window=get("BATCH_WINDOW", base.batch_window, float),
            freshness_wait=get("FRESHNESS_WAIT", base.freshness_wait, float),
            max_event_bytes=get("MAX_EVENT_BYTES", base.max_event_bytes, int),
            max_record_bytes=get("MAX_RECORD_BYTES", base.max_record_bytes, int),
            eager_recompile_limit=get("EAGER_RECOMPILE_LIMIT", base.eager_recompile_limit, int),
            revocation_lag_bound=get("REVOCATION_LAG_BOUND", base.revocation_lag_bound, float),
            session_timeout=get("SESSION_TIMEOUT", base.session_timeout, float),
            rebalance_timeout=get("REBALANCE_TIMEOUT", base.rebalance_timeout, float),
            log_level=get("LOG_LEVEL", base.log_level),
            log_format=get("LOG_FORMAT", base.log_format),
        )
