"""What `freshplan run` prints when ready: one parseable line in logs, a few lines on a terminal."""

from __future__ import annotations

from pathlib import Path

from agents.cli.ready import Ready, loaded_line, ready_text, request_file
from tests.conftest import ROOT


def _ready(**changes) -> Ready:
    base = dict(bootstrap="127.0.0.1:9092", embedded=True, http="http://127.0.0.1:6066",
                db_path=Path("/tmp/s/freshplan.duckdb"), run_file=Path("/tmp/s/run.json"), secret_in_run_file=True,
                callers_file=None, state_dir=Path("/tmp/s"), default_state_dir=False,
                request_file="scenarios/atlas-request.json")
    return Ready(**(base | changes))


def test_logs_get_one_line_naming_broker_http_state_and_secret():
    text = ready_text(_ready(), terminal=False)
    assert text == ("freshplan: ready: broker 127.0.0.1:9092 (embedded), HTTP http://127.0.0.1:6066, "
                    "state /tmp/s/freshplan.duckdb; the secret is in /tmp/s/run.json")


def test_a_terminal_gets_a_few_lines_with_where_things_are_and_how_to_select():
    lines = ready_text(_ready(), terminal=True).splitlines()
    assert lines[0] == "freshplan: ready" and len(lines) <= 8 and all(len(line) <= 100 for line in lines)
    shown = dict(line.split(None, 1) for line in lines[1:])
    assert shown["broker"].startswith("127.0.0.1:9092 (embedded") and shown["HTTP"] == "http://127.0.0.1:6066"
    assert shown["secret"].startswith("/tmp/s/run.json")
    assert shown["select"] == "freshplan select --file scenarios/atlas-request.json --state-dir /tmp/s"


def test_the_default_state_dir_needs_no_flag_and_a_callers_file_is_named():
    shown = ready_text(_ready(default_state_dir=True, secret_in_run_file=False, callers_file=Path("c.json"),
                              embedded=False), terminal=True)
    assert "--state-dir" not in shown and "callers from c.json" in shown and "(external)" in shown


def test_a_person_is_spared_the_freshness_token_a_pipe_gets():
    assert loaded_line(13, "a.jsonl", "ft2.xyz", terminal=True) == "freshplan: loaded 13 events from a.jsonl"
    assert loaded_line(13, "a.jsonl", "ft2.xyz", terminal=False).endswith("(freshness token ft2.xyz)")


def test_the_select_hint_uses_the_request_beside_a_loaded_scenario(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert request_file(["scenarios/atlas.jsonl"]) == "scenarios/atlas-request.json"
    assert request_file(["scenarios/synthetic-topk.jsonl"]) == "REQUEST.json"  # it has no request file
    assert request_file([]) == "REQUEST.json"


def test_the_readme_shows_what_a_terminal_gets():
    import re

    block = next(b for b in re.findall(r"```text\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
                 if "freshplan: ready" in b)
    loaded, ready = block.split("\n", 1)
    shown_broker = re.search(r"broker (\S+)", ready).group(1)  # a free port, different each run
    state = Path(".freshplan")
    expected = ready_text(Ready(shown_broker, True, "http://127.0.0.1:6066", state / "freshplan.duckdb",
                                state / "run.json", True, None, state, True, "scenarios/atlas-request.json"),
                          terminal=True)
    assert ready.rstrip("\n") == expected
    assert loaded == loaded_line(13, "scenarios/atlas.jsonl", "ft2.x", terminal=True)
