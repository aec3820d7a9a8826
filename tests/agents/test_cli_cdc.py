"""`freshplan cdc check MAPPING.json SAMPLE.json` prints the event, the skip, or the dead letter."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

from tests.cdc.test_fixtures import FIXTURES, fixture
from tests.conftest import ROOT

CHECK = [sys.executable, "-m", "agents.cli", "cdc", "check", str(FIXTURES / "mapping.json")]


def run(sample) -> subprocess.CompletedProcess:
    return subprocess.run(CHECK + [str(sample)], capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_a_bare_envelope_prints_its_event(tmp_path):
    sample = tmp_path / "sample.json"
    sample.write_text(json.dumps(fixture("mysql_create_with_schema")["value"]))
    out = run(sample)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == fixture("mysql_create_with_schema")["expect"]


def test_key_and_value_forms_tombstones_skips_and_dead_letters(tmp_path):
    for name, code in (("pg_tombstone_key_schema", 0), ("pg_heartbeat_with_schema", 0), ("pg_bad_json", 1),
                       ("pg_tombstone_schemaless_ambiguous_key", 1)):
        case = fixture(name)
        sample = tmp_path / f"{name}.json"
        sample.write_text(json.dumps({"key": case["key"], "value": case["value"]}))
        out = run(sample)
        assert out.returncode == code, (name, out.stdout, out.stderr)
        printed = json.loads(out.stdout)
        if "dead_letter" in case["expect"]:
            assert printed["dead_letter"]["error_class"] == case["expect"]["dead_letter"]["error_class"]
        elif "skipped" in case["expect"]:
            assert printed == case["expect"]
        else:
            assert printed["kind"] == "resource" and printed["op"] == "delete"


def test_an_unusable_mapping_file_exits_2_naming_it(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"tables": {"a.b": {"kind": "resource", "fields": {"id": "x", "colour": "y"}}}}')
    sample = tmp_path / "s.json"
    sample.write_text("{}")
    out = subprocess.run([sys.executable, "-m", "agents.cli", "cdc", "check", str(bad), str(sample)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and "colour" in out.stderr and "bad.json" in out.stderr


def test_the_walk_through_in_docs_cdc_prints_the_event_it_shows(tmp_path):
    # docs/cdc.md's mapping file (step 3), envelope and printed event (step 4), checked as a reader would.
    blocks = re.findall(r"```json\n(.*?)```", (ROOT / "docs" / "cdc.md").read_text(), re.S)
    mapping = next(b for b in blocks if b.lstrip().startswith('{"tables"'))
    envelope = next(b for b in blocks if b.lstrip().startswith('{"before"'))
    shown = next(b for b in blocks if b.lstrip().startswith('{"event_id"'))
    (tmp_path / "mapping.json").write_text(textwrap.dedent(mapping))
    (tmp_path / "sample.json").write_text(textwrap.dedent(envelope))
    out = subprocess.run([sys.executable, "-m", "agents.cli", "cdc", "check", "mapping.json", "sample.json"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(shown)
