"""/metrics on its own port (FRESHPLAN_METRICS_PORT), behind the same gate as the API."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from aiohttp import web

from agents.web.access import Access
from agents.web.gate import Gate, metrics_scope
from compiler.errors import RequestError
from streams.settings import Settings


async def serve_metrics(settings: Settings, access: Access, render: Callable[[], Awaitable[bytes]]) -> None:
    """Serve Prometheus text on settings.metrics_port until cancelled."""
    async def metrics(request: web.Request) -> web.Response:
        try:
            body = await render()
        except RequestError as exc:  # the state file cannot be read (StateError): no figures to give
            return web.json_response(exc.as_dict(), status=exc.status)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    gate = Gate(settings, access.callers, access.jwt, {"/metrics": metrics_scope(settings)})
    app = web.Application(middlewares=[gate.middleware])
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.web_host, settings.metrics_port).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
