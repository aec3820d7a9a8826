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


def _cdc_mapping(settings: Settings):
    """The CDC mapping file named by FRESHPLAN_CDC_MAPPING, read once; raises MappingError naming its problem."""
    from schemas.cdc_mapping import MappingError, parse

    if settings.cdc_mapping is None:
        return None
    try:
        text = settings.cdc_mapping.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MappingError(f"FRESHPLAN_CDC_MAPPING {settings.cdc_mapping} cannot be read "
                           f"({type(exc).__name__})") from None
    return parse(text, f"FRESHPLAN_CDC_MAPPING {settings.cdc_mapping}")


def _run_info(settings: Settings) -> dict:
    from agents.web.access import read_run_file

    return read_run_file(settings.run_file)
