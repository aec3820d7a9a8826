"""What `freshplan run` prints as it starts: one parseable line per step for logs, a short block for a person."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Ready:
    """Where a started worker can be reached and how to ask it for a plan."""

    bootstrap: str
    embedded: bool
    http: str
    db_path: Path
    run_file: Path
    secret_in_run_file: bool
    callers_file: Path | None
    state_dir: Path
    default_state_dir: bool
    request_file: str = "REQUEST.json"
    """A request body to show in the select hint: a loaded scenario's own, when it has one."""


def request_file(loaded: list[str]) -> str:
    """The request file beside the first loaded scenario that has one (`atlas.jsonl` -> `atlas-request.json`)."""
    for path in loaded:
        candidate = Path(path).with_name(Path(path).stem + "-request.json")
        if candidate.is_file():
            return str(candidate)
    return "REQUEST.json"


def loaded_line(count: int, path: str, token: str, terminal: bool) -> str:
    """The line for one scenario published before start; a person gets no freshness token (a pipe does)."""
    if terminal:
        return f"freshplan: loaded {count} events from {path}"
    return f"freshplan: loaded {count} events from {path} (freshness token {token})"


def ready_text(ready: Ready, terminal: bool) -> str:
    """The ready announcement: one line (logs and tests parse it) or, on a terminal, a few aligned lines."""
    where = (f"the secret is in {ready.run_file}" if ready.secret_in_run_file
             else f"callers from {ready.callers_file}")
    if not terminal:
        return (f"freshplan: ready: broker {ready.bootstrap} ({'embedded' if ready.embedded else 'external'}), "
                f"HTTP {ready.http}, state {ready.db_path}; {where}")
    select = f"freshplan select --file {shlex.quote(ready.request_file)}"
    if not ready.default_state_dir:
        select += f" --state-dir {shlex.quote(str(ready.state_dir))}"
    secret = (f"{ready.run_file} (the CLI sends it; curl needs Authorization: Bearer <token>)"
              if ready.secret_in_run_file else f"callers from {ready.callers_file}")
    broker = f"{ready.bootstrap} ({'embedded, topics in memory' if ready.embedded else 'external'})"
    rows = [("broker", broker), ("HTTP", ready.http), ("state", str(ready.db_path)), ("secret", secret),
            ("select", select), ("stop", "Ctrl-C")]
    return "\n".join(["freshplan: ready"] + [f"  {name:<7}{value}" for name, value in rows])
