"""Every command shown in README.md and docs/ (each line of a ```sh block) is run by a named test."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

# command as shown (comment dropped, `\` continuations joined) -> the test that runs it, and a string
# of that test's file which shows it does (the command's flag or script, the doc line it reads).
ATLAS_RUN = "tests/test_cli.py::test_run_with_embedded_broker_serves_the_atlas_scenario"
EXERCISED = {
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/freshplan run --load scenarios/atlas.jsonl":
        (ATLAS_RUN, '"--load", "scenarios/atlas.jsonl"'),
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/pytest":
        ("tests/test_docs.py::test_the_readme_test_command_is_what_ci_runs", ".ci"),  # and .ci/run runs it
    ".venv/bin/freshplan select --file scenarios/atlas-request.json":
        (ATLAS_RUN, '"--file", "scenarios/atlas-request.json"'),
    ".venv/bin/freshplan plan <plan_id>":
        (ATLAS_RUN, '["plan", plan["plan_id"]'),
    ".venv/bin/freshplan status":
        (ATLAS_RUN, '["status", "--state-dir"'),
    ".venv/bin/freshplan load scenarios/atlas.jsonl":
        (ATLAS_RUN, '["load", "scenarios/atlas.jsonl"'),
    ".venv/bin/freshplan schemas export contracts/":
        ("tests/test_cli.py::test_schemas_export_writes_one_schema_per_topic", '["schemas", "export"'),
    ".venv/bin/freshplan --help":
        ("tests/test_cli.py::test_help_describes_every_command", '["--help"]'),
    "TOKEN=$(python3 -c 'import json; print(json.load(open(\".freshplan/run.json\"))[\"token\"])')":
        (ATLAS_RUN, '"docs" / "operate.md"'),
    "curl -s -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' "
    "--data @scenarios/atlas-request.json http://127.0.0.1:6066/v1/select":
        (ATLAS_RUN, "_documented_curl"),
    "curl -s http://127.0.0.1:6066/readyz":
        (ATLAS_RUN, "_documented_curl"),
    "KAFKA_BOOTSTRAP_SERVERS=<broker> .venv/bin/freshplan replay":
        ("tests/agents/test_replay.py::test_replay_rebuilds_state_and_announces_what_changed", '"replay"'),
    "KAFKA_BOOTSTRAP_SERVERS=<broker> .venv/bin/freshplan run --rebase":
        ("tests/hostile/test_two_workers.py::"
         "test_both_workers_rebased_onto_a_reset_broker_serve_and_announce_nothing_stale", '"run", "--rebase"'),
    ".venv/bin/freshplan chaos --only hostile_requests":
        ("tests/bench/test_chaos.py::test_the_documented_one_fault_command_prints_the_table_and_writes_json",
         "freshplan chaos --only"),
    # The whole catalogue is the same command over every fault (about three minutes): the suite runs
    # each fault's code in tests/hostile/ and the command itself on one fault.
    ".venv/bin/freshplan chaos":
        ("tests/bench/test_chaos.py::test_the_documented_one_fault_command_prints_the_table_and_writes_json",
         '"agents.cli"'),
    ".venv/bin/freshplan cdc check mapping.json sample.json":
        ("tests/agents/test_cli_cdc.py::test_the_walk_through_in_docs_cdc_prints_the_event_it_shows",
         '"cdc", "check", "mapping.json", "sample.json"'),
    ".venv/bin/freshplan tokens init":
        ("tests/agents/test_cli_tokens.py::test_tokens_init_makes_a_private_key_file_once", '_shown("tokens init")'),
    ".venv/bin/freshplan tokens rotate":
        ("tests/agents/test_cli_tokens.py::test_tokens_rotate_signs_after_10_s_and_keeps_the_old_key_a_day",
         '_shown("tokens rotate")'),
    ".venv/bin/freshplan tokens rotate --grace 0 --sign-after 2":
        ("tests/agents/test_cli_tokens.py::test_tokens_rotate_retiring_a_leaked_key_ends_its_window_two_seconds_later",
         '_shown("tokens rotate --grace 0 --sign-after 2")'),
    ".venv/bin/freshplan cdc demo":
        ("tests/cdc/test_demo.py::test_the_cdc_walkthrough_shows_the_invalidation_and_the_new_plan", '"cdc", "demo"'),
    ".venv/bin/python examples/cache_subscriber.py --max-seconds 10":
        ("tests/streams/test_plan_cache.py::test_cache_follows_invalidations_and_survives_restart",
         "examples/cache_subscriber.py"),
    ".venv/bin/freshplan bench --quick":
        ("tests/bench/test_suite.py::test_bench_quick_writes_results_summary_and_plots", '"bench", "--quick"'),
    # Full size is the same code at larger sizes (about 40 minutes): CI runs --quick.
    ".venv/bin/freshplan bench":
        ("tests/bench/test_suite.py::test_bench_quick_writes_results_summary_and_plots", '"bench"'),
    ".venv/bin/python bench/select_latency.py":
        ("tests/bench/test_scripts.py::test_select_latency_benchmark_runs", "bench/select_latency.py"),
    ".venv/bin/python docs/flow.py":
        ("tests/test_docs.py::test_the_flow_picture_renders_from_its_source", '"docs/flow.py"'),
    ".venv/bin/python docs/generate.py":
        ("tests/test_docs.py::test_the_generator_command_writes_every_page", '"docs/generate.py"'),
    ".venv/bin/python docs/generate.py --check":
        ("tests/test_docs.py::test_the_generator_command_checks_without_writing", '"--check"'),
}


def shown_commands() -> dict[str, str]:
    """Every command line of a ```sh block in README.md and docs/*.md, with the page showing it first."""
    found: dict[str, str] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S):
            for line in re.sub(r"\\\n\s*", "", block).splitlines():
                command = re.sub(r"\s+#.*$", "", line).strip()
                if command:
                    found.setdefault(command, page.relative_to(ROOT).as_posix())
    return found


def test_every_shown_command_names_the_test_that_runs_it():
    missing = {c: page for c, page in shown_commands().items() if c not in EXERCISED}
    assert not missing, f"commands shown without a test (add one, and name it in EXERCISED): {missing}"


def test_no_test_is_named_for_a_command_no_page_shows_any_more():
    assert set(EXERCISED) <= set(shown_commands()), set(EXERCISED) - set(shown_commands())


@pytest.mark.parametrize("command", sorted(EXERCISED))
def test_the_named_test_exists_and_runs_the_command(command):
    node, evidence = EXERCISED[command]
    path, name = node.split("::")
    source = (ROOT / path).read_text()
    assert re.search(rf"^(async )?def {name}\(", source, re.M), node
    assert evidence in source, (node, evidence)
