"""Service settings: one immutable record, read from the environment once at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

from schemas.timefmt import parse_duration
from streams.kafka_security import KafkaSecurity

INPUT_TOPICS = ("source-changes", "policy-versions", "revocations", "clock")
OUTPUT_TOPICS = ("plan-invalidations", "plans", "receipts", "dead-letters")
INTERNAL_TOPICS = ("plan-dependencies", "entity-changes", "shared-changes")
"""Read and written by workers only: they name withheld resources, so callers get no ACL on them."""
COMPACTED_TOPICS = ("plans", "plan-dependencies")
KEPT_TOPICS = ("entity-changes", "shared-changes")
"""The routed lanes: each shard's history (a gained shard is restored from it), kept whatever the broker's default."""


class SettingsError(ValueError):
    """A FRESHPLAN_* variable holds a value the service cannot use; the message names it and says what fits."""


EMBEDDED_SESSION_TIMEOUT = 4.0
"""The session timeout when `run` starts the embedded broker: Tansu holds each JoinGroup for half the session
timeout (in 1 s steps), so a take-over after kill -9 costs about 1.5x it; Apache Kafka's floor of 6 s is not
there."""


@dataclass(frozen=True)
class Settings:
    """Everything a freshplan process needs to know; injected, never read from globals."""

    bootstrap_servers: str | None = None
    """Kafka `host:port[,host:port]` of the cluster to use; unset starts the embedded broker."""
    app_id: str = "freshplan"
    """Faust application id: the consumer group and the changelog prefix."""
    topic_prefix: str = ""
    """Prepended to every topic name, so that tests and tenants can share a broker."""
    partitions: int = 4
    """Partition count of every topic the service creates (equal for co-partitioning)."""
    state_dir: Path = field(default_factory=lambda: Path(".freshplan"))
    """Directory holding the DuckDB file (`freshplan.duckdb`), Faust's data dir and the run file (`run.json`)."""
    web_host: str = "127.0.0.1"
    """Interface the HTTP API binds to."""
    web_port: int = 6066
    """Port of the HTTP API."""
    wall_clock: bool = True
    """Publish clock ticks from wall time (for deployments without a clock producer)."""
    wall_clock_interval: float = 1.0
    """Seconds between wall-clock ticks."""
    batch_size: int = 500
    """Most events one agent applies in one DuckDB transaction; while a worker is behind (a fetch came back full)
    a batch takes up to 4x as many, so a plan changed several times is recompiled and announced once."""
    batch_window: float = 0.05
    """Seconds an agent waits to fill a batch before applying what it has."""
    freshness_wait: float = 5.0
    """Longest a select waits for `at_least_as_fresh` before refusing."""
    revocation_lag_bound: float = 5.0
    """Seconds behind on revocations or policy versions beyond which selects are refused (HTTP 503)."""
    eager_recompile_limit: int = 0
    """Plans one batch may recompile before announcing. At 0 (the default) a touched plan is announced in the
    batch's own transaction (successor id `null`) and its successor compiled in the background, except up
    to 16 plans touched only through a resource they left out: compiled first, announced if they changed."""
    backlog_step: int = 16
    """Announced plans one background job recompiles at most while input streams in; four times as many while
    none would wait behind the job (catching up, or no input for 0.2 s). An event or a select that must compile
    waits for the job in progress: smaller steps keep that short, bigger ones drain a fan-out sooner."""
    max_event_bytes: int = 1_000_000
    """Events larger than this (bytes) are dead-lettered unread as `oversized`."""
    max_record_bytes: int = 1_000_000
    """Largest record the service publishes (the producer's max request size); larger plans and receipts go out
    compact, and what still does not fit is dead-lettered `record_too_large`."""
    max_query_bytes: int = 4096
    """Longest select `query` in UTF-8 bytes; longer ones get 422 `field_too_large`."""
    max_budget_tokens: int = 1_000_000_000
    """Largest `budget.tokens` a select may ask for (422 `budget_too_large` beyond)."""
    max_budget_calls: int = 1_000_000
    """Largest `budget.calls` a select may ask for (422 `budget_too_large` beyond); `latency_ms` may go up to a
    day, `privacy` and `money` up to 1e12."""
    max_clock_jump: timedelta = timedelta(days=400)
    """ISO 8601 duration; a clock tick further than this past the current now is dead-lettered (`clock_jump`)
    and changes nothing (the first tick ever has no bound)."""
    max_event_skew: timedelta = timedelta(minutes=5)
    """ISO 8601 duration; a principal record dated further than this ahead of its publication is taken as of
    unknown time (it cannot undo a revocation; counted as `principal_time_ahead`)."""
    session_timeout: float = 6.0
    """Seconds without heartbeats before the group drops a worker: a killed worker's plans move after this plus
    the rebalance. Default 6 (Apache Kafka refuses less by default), 4 without KAFKA_BOOTSTRAP_SERVERS (`run`
    starts the embedded broker, which holds every JoinGroup for half of this: a rebalance takes that long)."""
    rebalance_timeout: float = 3.0
    """Seconds the broker waits for members to rejoin; also bounds a cold start's first join."""
    log_level: str = "info"
    """Logging level of the worker; below `debug`, Faust's, mode's and aiokafka's INFO lines are left out."""
    log_format: str = "auto"
    """`auto`: short text lines on a terminal, JSON lines (ids and reason codes, never content) when piped; or
    force `json` or `text`."""
    plan_retention: timedelta = timedelta(days=30)
    """ISO 8601 duration of event time a plan key may go unselected before its plan is evicted (announced
    `evicted`); also how long invalidated plan rows are kept."""
    receipt_retention: timedelta = timedelta(days=400)
    """ISO 8601 duration of event time receipts are kept in DuckDB (the `receipts` topic keeps them for auditors)."""
    retention_interval: float = 10.0
    """Seconds between retention passes (each bounded to 1,000 removals of each kind)."""
    event_id_retention: timedelta = timedelta(days=7)
    """ISO 8601 duration of event time (at least `PT1H`) an event id is remembered after it was first applied (up to
    twice this):
    a repeat within it is a counted duplicate, a repeat after it is applied again (versions still ignore older
    upserts; docs/operate.md, "Retention")."""
    standby_replicas: int = 0
    """Warm copies of other workers' entity partitions each worker keeps (0 to partitions - 1): a partition it
    then gains needs no restore from its lane, at the cost of holding and applying the copies."""
    read_ahead: bool = True
    """Restore likely gains before the group assigns them: the partitions of a peer whose web port refuses
    connections (a kill -9, noticed within a second where the group waits out its session timeout), and, while the
    group rebalances, those a standby copy would hold (the next one after each owned partition). They are copies
    until an assignment gives them, and dropped if it does not (a joining worker costs each peer a lane read)."""
    restore_stall_seconds: float = 15.0
    """Seconds a gained shard's lane read may take to start (its first offsets asked of the broker) before it gives
    up (at least 1): nothing moves, and it is retried after its backoff. Also the longest a take-over waits for the
    plan feed to read a gained partition's parked plans (later ones are judged as they arrive)."""
    rebase: bool = False
    """Accept input topics that were reset (new broker or recreated topics): re-read them from their start."""
    check_head_cache: bool = False
    """`1`: every select answered from memory also reads the state file and logs `head cache disagrees` on a
    difference (the test suite's check; costs the reads the cache saves)."""
    wal_limit_mb: int = 64
    """Write-ahead log (MB, at least 1) from which DuckDB checkpoints at a commit even while events apply; an idle
    worker (no batch for a second) checkpoints from a sixteenth of it (docs/operate.md, "One writer")."""
    gc_freeze: bool = True
    """Once ready, take what start-up built out of garbage collection (full collections stop pausing selects);
    `0` leaves the collector as Python sets it."""
    kafka: KafkaSecurity = field(default_factory=KafkaSecurity)
    """TLS and SASL settings every Kafka client of the process uses."""
    token: str | None = field(default=None, repr=False)
    """FRESHPLAN_TOKEN: the secret the CLI sends; without a callers file, `run` serves it instead of generating one
    (16+ characters)."""
    token_key_file: Path | None = None
    """FRESHPLAN_TOKEN_KEY_FILE: keys that sign freshness tokens (made on first start, 0600, re-read every second;
    docs/security.md); unset means token-keys.json in the state dir. Every worker of a group must use the same file."""
    callers_file: Path | None = None
    """JSON file of callers (secret hashes, principals, scopes; docs/security.md); unset means the single run.json
    secret."""
    jwt_jwks_file: Path | None = None
    """JWKS file with the public keys that sign end-user JWTs (set with the issuer and audience); JWTs are refused
    without it."""
    jwt_issuer: str | None = None
    """Required `iss` of end-user JWTs."""
    jwt_audience: str | None = None
    """Required `aud` of end-user JWTs."""
    jwt_principal_claim: str = "sub"
    """JWT claim naming the only principal a JWT caller may ask for."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins allowed to call the API (comma-separated); any other Origin header gets 403."""
    allowed_hosts: tuple[str, ...] = ()
    """Host header names accepted (comma-separated, port ignored); empty means the bind address, localhost,
    127.0.0.1, [::1]."""
    metrics_port: int | None = None
    """Serve /metrics on this port instead of the API port."""
    metrics_auth: str = "open"
    """`open`, or `status`: /metrics then needs a caller with the `status` scope."""
    cdc_mapping: Path | None = None
    """JSON file mapping Debezium tables onto freshplan records (docs/cdc.md); unset: rows carry freshplan's field
    names. Read once at start-up: `run` and `replay` refuse to start, naming the problem, if it does not parse
    or names an unknown field."""

    @property
    def db_path(self) -> Path:
        """The DuckDB file with catalog, index, plans and offsets."""
        return self.state_dir / "freshplan.duckdb"

    @property
    def token_keys_path(self) -> Path:
        """The token key file: FRESHPLAN_TOKEN_KEY_FILE, else token-keys.json beside the DuckDB file."""
        return self.token_key_file or self.state_dir / "token-keys.json"

    @property
    def run_file(self) -> Path:
        """Where `freshplan run` records the broker and HTTP addresses it uses."""
        return self.state_dir / "run.json"

    @property
    def hosts(self) -> frozenset[str]:
        """Host names the API answers to (lower case, no port)."""
        if self.allowed_hosts:
            return frozenset(h.lower() for h in self.allowed_hosts)
        return frozenset({self.web_host.lower(), "localhost", "127.0.0.1", "[::1]", "::1"})

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
            try:
                return cast(raw)
            except (ValueError, TypeError, OverflowError):
                what = {int: "a whole number", float: "a number",
                        parse_duration: "an ISO 8601 duration such as PT5M"}.get(cast, "usable (see docs/settings.md)")
                raise SettingsError(f"FRESHPLAN_{name}={raw!r} is not {what}") from None


        return cls(
            bootstrap_servers=env.get("KAFKA_BOOTSTRAP_SERVERS") or None,
            app_id=get("APP_ID", base.app_id),
            topic_prefix=get("TOPIC_PREFIX", base.topic_prefix),
            partitions=get("PARTITIONS", base.partitions, int),
            standby_replicas=get("STANDBY_REPLICAS", base.standby_replicas, int),
            read_ahead=get("READ_AHEAD", base.read_ahead, bool),
            restore_stall_seconds=max(1.0, get("RESTORE_STALL_SECONDS", base.restore_stall_seconds, float)),
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
            backlog_step=max(1, get("BACKLOG_STEP", base.backlog_step, int)),
            revocation_lag_bound=get("REVOCATION_LAG_BOUND", base.revocation_lag_bound, float),
            max_query_bytes=get("MAX_QUERY_BYTES", base.max_query_bytes, int),
            max_budget_tokens=get("MAX_BUDGET_TOKENS", base.max_budget_tokens, int),
            max_budget_calls=get("MAX_BUDGET_CALLS", base.max_budget_calls, int),
            max_clock_jump=get("MAX_CLOCK_JUMP", base.max_clock_jump, parse_duration),
            max_event_skew=get("MAX_EVENT_SKEW", base.max_event_skew, parse_duration),
            session_timeout=_session_timeout(get("SESSION_TIMEOUT", base.session_timeout if env.get(
                "KAFKA_BOOTSTRAP_SERVERS") else EMBEDDED_SESSION_TIMEOUT, float)),
            rebalance_timeout=get("REBALANCE_TIMEOUT", base.rebalance_timeout, float),
            log_level=get("LOG_LEVEL", base.log_level),
            log_format=get("LOG_FORMAT", base.log_format),
            kafka=KafkaSecurity.from_env(env),
            token=get("TOKEN", None),
            callers_file=get("CALLERS_FILE", None, Path),
            token_key_file=get("TOKEN_KEY_FILE", None, Path),
            jwt_jwks_file=get("JWT_JWKS_FILE", None, Path),
            jwt_issuer=get("JWT_ISSUER", None),
            jwt_audience=get("JWT_AUDIENCE", None),
            jwt_principal_claim=get("JWT_PRINCIPAL_CLAIM", base.jwt_principal_claim),
            allowed_origins=get("ALLOWED_ORIGINS", (), _words),
            allowed_hosts=get("ALLOWED_HOSTS", (), _words),
            metrics_port=get("METRICS_PORT", None, int),
            metrics_auth=get("METRICS_AUTH", base.metrics_auth),
            cdc_mapping=get("CDC_MAPPING", None, Path),
            plan_retention=get("PLAN_RETENTION", base.plan_retention, parse_duration),
            receipt_retention=get("RECEIPT_RETENTION", base.receipt_retention, parse_duration),
            retention_interval=get("RETENTION_INTERVAL", base.retention_interval, float),
            event_id_retention=get("EVENT_ID_RETENTION", base.event_id_retention, parse_duration),
            check_head_cache=get("CHECK_HEAD_CACHE", base.check_head_cache, bool),
            gc_freeze=get("GC_FREEZE", base.gc_freeze, bool),
            wal_limit_mb=get("WAL_LIMIT_MB", base.wal_limit_mb, int),
        )


def _words(raw: str) -> tuple[str, ...]:
    """A comma- or space-separated list."""
    return tuple(w for w in raw.replace(",", " ").split() if w)


def heartbeat_interval(session_timeout: float) -> float:
    """Seconds between a group member's heartbeats: an eighth of the session timeout, at most 1 s."""
    return min(1.0, session_timeout / 8)


def _session_timeout(seconds: float) -> float:
    """A usable session timeout, or SettingsError: heartbeats come an eighth of it apart."""
    if not seconds >= 1.0:  # NaN too
        raise SettingsError(f"FRESHPLAN_SESSION_TIMEOUT={seconds:g} is under 1 second: a worker would be dropped "
                            "from its group between heartbeats; use 4 to 10 (Apache Kafka needs 6 or more)")
    return seconds
