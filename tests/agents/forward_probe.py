"""A `freshplan run` worker that also writes what `owner_url` answers for every input partition (tests only)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import faust
import orjson

from agents.cli.main import main as cli_main
from agents.web.forward import owner_url
from streams.settings import INPUT_TOPICS, Settings


def main() -> int:
    """Run the worker with a timer that writes {canonical_url, owners: topic -> partition -> url} to a file."""
    path = Path(os.environ["FRESHPLAN_PROBE_FILE"])
    settings = Settings.from_env()
    original = faust.App.__init__

    def init(app, *args, **kwargs):
        original(app, *args, **kwargs)

        @app.timer(interval=0.2)
        async def probe() -> None:
            owners = {name: {str(p): owner_url(app, settings.topic(name), p) for p in range(settings.partitions)}
                      for name in INPUT_TOPICS}
            scratch = path.with_suffix(".tmp")
            scratch.write_bytes(orjson.dumps({"canonical_url": str(app.conf.canonical_url), "owners": owners}))
            scratch.replace(path)

    faust.App.__init__ = init
    return cli_main(["run"])


if __name__ == "__main__":
    sys.exit(main())
