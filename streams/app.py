"""The Faust application, configured from injected settings."""

from __future__ import annotations

from typing import Any, Sequence

import faust
from faust.tables import TableManager

from streams.settings import Settings, heartbeat_interval

STREAM_CHECKS_OFF = 10 * 365 * 24 * 3600.0  # seconds: longer than any worker runs


def create_app(settings: Settings, bootstrap_servers: str, middlewares: Sequence[Any] = ()) -> faust.App:
    """A Faust app for one worker: no tables (state is DuckDB), web server on the settings' port.

    Faust's own pages (/router/, /table/, /graph/, statistics, /performance/) are switched off:
    they would answer without the callers' credentials. `middlewares` wrap every HTTP request.
    """
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return faust.App(
        settings.app_id,
        broker=[f"kafka://{server.strip()}" for server in bootstrap_servers.split(",")],
        datadir=str(settings.state_dir / "faust"),
        autodiscover=False,
        store="memory://",
        topic_partitions=settings.partitions,
        topic_allow_declare=True,
        consumer_auto_offset_reset="earliest",
        web_enabled=True,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        web_metrics_enabled=False,
        web_application_options={"middlewares": list(middlewares)},
        broker_credentials=settings.kafka.faust_credentials(),
        producer_acks=-1,
        producer_max_request_size=settings.max_record_bytes,
        broker_commit_interval=1.0,
        broker_session_timeout=settings.session_timeout,
        broker_rebalance_timeout=settings.rebalance_timeout,
        # The broker notices a dead member at a survivor's heartbeat after its session expired: heartbeats
        # an eighth of the session apart keep that within 1/8 of it (0.5 s at the embedded 4 s, not 1 s).
        broker_heartbeat_interval=heartbeat_interval(settings.session_timeout),
        # Its checks log an error per input partition that fetched nothing for this long: the input
        # partitions are paused on purpose (`agents.stream.duty`), the replica reads them.
        stream_processing_timeout=STREAM_CHECKS_OFF,
        TableManager=UnpausedTableManager,
    )


class UnpausedTableManager(TableManager):
    """Faust's table manager without its one-second pause before subscribing.

    Faust waits a second at start so that tables declared late are still recovered; this app declares none
    (its state is DuckDB), and the pause delayed every worker's start, a restart's included, by it.
    """

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()
