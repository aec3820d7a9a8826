"""`freshplan tokens init` and `tokens rotate`, run as docs/operate.md shows them ("Rotate the token keys")."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from datetime import datetime

import pytest

from tests.conftest import ROOT


def _shown(command: str) -> list[str]:
    """The documented line, read off docs/operate.md, as the arguments after `freshplan`."""
    page = (ROOT / "docs" / "operate.md").read_text()
    line = next(line for line in page.splitlines() if line.startswith(f".venv/bin/freshplan {command}"))
    words = shlex.split(line.split("#", 1)[0])
    assert words[:1] == [".venv/bin/freshplan"] and " ".join(words[1:]) == command
    return words[1:]


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRESHPLAN_")}
    return subprocess.run([sys.executable, "-m", "agents.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def _keys(path) -> list[dict]:
    return json.loads(path.read_text())["keys"]


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def key_file(tmp_path):
    return tmp_path / ".freshplan" / "token-keys.json"


def test_tokens_init_makes_a_private_key_file_once(tmp_path, key_file):
    out = _run(_shown("tokens init"), tmp_path)
    assert out.returncode == 0 and "holds 1 keys" in out.stdout, out
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    first = key_file.read_text()
    assert _keys(key_file)[0]["secret"] not in out.stdout + out.stderr
    assert _run(_shown("tokens init"), tmp_path).returncode == 0 and key_file.read_text() == first  # kept


def test_tokens_rotate_signs_after_10_s_and_keeps_the_old_key_a_day(tmp_path, key_file):
    assert _run(_shown("tokens init"), tmp_path).returncode == 0
    out = _run(_shown("tokens rotate"), tmp_path)
    assert out.returncode == 0 and "holds 2 keys" in out.stdout, out
    new, old = _keys(key_file)
    assert new["accepted_until"] is None
    assert abs(_at(new["signs_from"]) - (os.path.getmtime(key_file) + 10)) < 5
    assert _at(old["accepted_until"]) - _at(new["signs_from"]) == pytest.approx(86_400, abs=1)


def test_tokens_rotate_retiring_a_leaked_key_ends_its_window_two_seconds_later(tmp_path, key_file):
    assert _run(_shown("tokens init"), tmp_path).returncode == 0
    out = _run(_shown("tokens rotate --grace 0 --sign-after 2"), tmp_path)
    assert out.returncode == 0, out
    new, old = _keys(key_file)
    assert _at(old["accepted_until"]) == pytest.approx(_at(new["signs_from"]), abs=1)
    assert abs(_at(new["signs_from"]) - (os.path.getmtime(key_file) + 2)) < 5
