"""The Faust worker class that runs a built freshplan worker: ready once revocation lag is known, stopped in bounds."""

from __future__ import annotations

import asyncio

from streams.settings import Settings

LOOP_SETTLE = 0.1
"""Seconds the event loop keeps turning after every service stopped, before it closes (mode's default is 1)."""


def service_worker(worker, settings: Settings, broker, run_info: dict, ready_line: str):
    """The Faust worker class that runs `worker`: it says ready once revocation lag is known, and stops in bounds."""
    import faust

    from agents.ops.shutdown import bounded_stop
    from agents.web.access import write_run_file

    class ServiceWorker(faust.Worker):
        async def on_startup_finished(self) -> None:
            await super().on_startup_finished()
            await worker.guard.wait_checked()  # ready means revocation lag is known
            worker.collector.settle()  # what start-up built is long-lived: out of every later full collection
            # Written only once the HTTP API answers, so `load`/`select` can rely on it.
            write_run_file(settings.run_file, run_info)
            print(ready_line, flush=True)

        async def _sentinel_task(self) -> None:
            # mode idles a whole second here before closing the loop; what is still pending once every
            # service has stopped needs a few loop turns at most, and the state file waits for this.
            await asyncio.sleep(LOOP_SETTLE)

        async def stop(self) -> None:
            worker.stopping.set()
            await bounded_stop(super().stop(), lambda: (settings.run_file.unlink(missing_ok=True),
                                                        broker and broker.stop()))

    return ServiceWorker
