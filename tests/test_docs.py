"""The README and docs/: short, generated pages in step with the code, the flow picture renders from its source."""

from __future__ import annotations

import importlib.util
import re
import struct
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from streams.settings import Settings
from tests.conftest import ROOT

DOCS = ROOT / "docs"
MANUAL = ("operate.md", "security.md", "cdc.md", "scaling.md", "plans.md", "evidence.md", "bench.md", "settings.md")
GENERATED = ("settings.md", "http-api.md", "topics.md")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_read_in_five_minutes_and_maps_every_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for page in MANUAL + GENERATED:
        assert f"(docs/{page})" in readme, page
    assert "![" in readme and "(docs/flow.png)" in readme


def test_the_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()[-1]
    readme = (ROOT / "README.md").read_text()
    command = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/pytest"
    assert f"```sh\n{command}\n```" in readme
    assert ci.replace(" -q", "") == command


@pytest.mark.parametrize("page", sorted(set(MANUAL + GENERATED)))
def test_each_page_starts_with_what_its_reader_will_be_able_to_do(page):
    text = (DOCS / page).read_text()
    assert text.startswith("# ")
    first = next(p for p in _paragraphs(text) if not p.startswith(("#", "<!--")))
    assert first.startswith("After this page you can "), first


@pytest.mark.parametrize("page", ["README.md"] + [f"docs/{p}" for p in MANUAL if p not in GENERATED])
def test_no_paragraph_runs_past_150_words(page):
    long = [p[:80] for p in _paragraphs((ROOT / page).read_text()) if len(p.split()) > 150]
    assert not long, long


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs and list items (code blocks and tables left out)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("|")]
        item: list[str] = []
        for line in lines:
            if re.match(r"\s*([-*]|\d+\.) ", line) and item:
                out.append(" ".join(item))
                item = []
            item.append(line.strip())
        if item:
            out.append(" ".join(item))
    return out


@pytest.mark.parametrize("page", ["README.md"] + [f"docs/{p}" for p in sorted(set(MANUAL + GENERATED))])
def test_every_link_to_a_page_or_section_leads_somewhere(page):
    text = re.sub(r"```.*?```", "", (ROOT / page).read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http:", "https:")):
            continue
        name, _, anchor = target.partition("#")
        linked = (ROOT / page).parent / name if name else ROOT / page
        assert linked.exists(), (page, target)
        if anchor:
            assert anchor in _anchors(linked.read_text()), (page, target)


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("page", GENERATED)
def test_a_generated_page_is_what_the_code_says(page):
    generate = _module("generate")
    expected = generate.pages()[DOCS / page]
    assert (DOCS / page).read_text() == expected, f"docs/{page} is stale: run `.venv/bin/python docs/generate.py`"


def test_the_generator_command_checks_without_writing():
    done = subprocess.run([sys.executable, "docs/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_generator_command_writes_every_page(tmp_path):
    # Run on a copy of the tree's sources, so that the test never writes the repository's own docs/.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "generate.py").write_text((DOCS / "generate.py").read_text())
    for source in ("agents", "schemas"):
        (tmp_path / source).symlink_to(ROOT / source)
    done = subprocess.run([sys.executable, "docs/generate.py"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for page in GENERATED:
        assert (tmp_path / "docs" / page).read_text() == (DOCS / page).read_text(), page


def test_a_page_that_disagrees_with_the_code_fails_the_check(monkeypatch, tmp_path, capsys):
    generate = _module("generate")
    code_says = generate.settings_page()
    page = tmp_path / "settings.md"
    monkeypatch.setattr(generate, "pages", lambda: {page: code_says})
    page.write_text(code_says.replace("| `FRESHPLAN_WEB_PORT` | `6066` |", "| `FRESHPLAN_WEB_PORT` | `7077` |"))
    assert generate.main(["--check"]) == 1 and "settings.md differs from the code" in capsys.readouterr().err
    page.write_text(code_says)
    assert generate.main(["--check"]) == 0


def _other_value(value: object, kind: str) -> str:
    """An environment value that reads back as something other than this default (of annotated type `kind`)."""
    if value is None:
        return "7" if kind.startswith("int") else "/elsewhere" if kind.startswith("Path") else "x"
    if isinstance(value, bool):
        return "0" if value else "1"
    if isinstance(value, timedelta):
        return "P3D"
    if isinstance(value, (int, float)):
        return "7"
    if isinstance(value, tuple):
        return "a.example,b.example"
    return "/elsewhere" if isinstance(value, Path) else "SASL_SSL"


def test_every_documented_variable_is_the_one_the_code_reads():
    # The generator reads names off `from_env`; this proves each one by setting it.
    generate = _module("generate")
    rows = generate.setting_rows()
    assert len(rows) >= 45 and all(meaning for *_, meaning in rows), [r for r in rows if not r[3]]
    base = Settings()
    for name, field, _, _ in rows:
        kafka = name.startswith("KAFKA_") and name != "KAFKA_BOOTSTRAP_SERVERS"
        record = base.kafka if kafka else base
        kind = type(record).__dataclass_fields__[field].type
        changed = Settings.from_env({name: _other_value(getattr(record, field), kind)})
        got = getattr(changed.kafka if kafka else changed, field)
        assert got != getattr(record, field), name


def test_the_http_reference_names_every_route_and_status():
    import json

    spec = json.loads((ROOT / "agents" / "openapi.json").read_text())
    page = (DOCS / "http-api.md").read_text()
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            section = page.split(f"## `{method.upper()} {path}`", 1)[1].split("\n## ", 1)[0]
            assert all(f"\n| {status} | " in section for status in op["responses"]), (method, path)
    assert "|  |" not in page  # every answer has its meaning


def test_the_topic_list_names_every_schema_and_its_fields():
    page = (DOCS / "topics.md").read_text()
    from schemas.codec import TOPICS

    for topic in TOPICS:
        assert f"## `{topic}` (" in page, topic
    assert "| `delegation_version` |  | integer |" in page  # a field of revocations, with its description


def test_the_flow_picture_renders_from_its_source(tmp_path):
    out = tmp_path / "flow.png"
    subprocess.run([sys.executable, "docs/flow.py", str(out)], cwd=ROOT, check=True, timeout=120)
    assert _png_size(out) == _png_size(DOCS / "flow.png") == (1000, 520)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])
