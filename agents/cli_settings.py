"""Settings of a CLI invocation: the environment, its flags, and the local run file."""

from __future__ import annotations

import argparse
from pathlib import Path

from streams.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env().with_overrides(
        web_host=getattr(args, "host", None), web_port=getattr(args, "port", None),
        state_dir=Path(args.state_dir) if getattr(args, "state_dir", None) else None,
        partitions=getattr(args, "partitions", None),
        wall_clock=False if getattr(args, "no_wall_clock", False) else None,
        rebase=True if getattr(args, "rebase", False) else None)


def _run_info(settings: Settings) -> dict:
    from agents.access import read_run_file

    return read_run_file(settings.run_file)
