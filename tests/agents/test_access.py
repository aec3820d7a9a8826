"""Access at start-up: the local secret lives in run.json (0600) across restarts; bad settings stop `run`."""

from __future__ import annotations

import json
import stat

import pytest

from agents.web.access import AccessError, load_access, read_run_file, write_run_file
from agents.web.callers import match
from streams.settings import Settings


def test_a_local_secret_is_generated_once_and_kept(tmp_path):
    settings = Settings(state_dir=tmp_path)
    first = load_access(settings)
    assert first.local_token and len(first.local_token) >= 32 and first.reload is not None  # the token keys
    assert stat.S_IMODE(settings.token_keys_path.stat().st_mode) == 0o600
    assert load_access(settings).token_keys.sign_with() == first.token_keys.sign_with()  # kept across restarts
    assert match(first.callers(), first.local_token).scopes == {"select", "plans", "receipts", "status", "admin"}
    write_run_file(settings.run_file, {"token": first.local_token})
    assert stat.S_IMODE(settings.run_file.stat().st_mode) == 0o600
    assert load_access(settings).local_token == first.local_token
    assert load_access(Settings(state_dir=tmp_path / "other")).local_token != first.local_token


def test_a_declared_token_wins_and_must_be_long_enough(tmp_path):
    assert load_access(Settings(state_dir=tmp_path, token="declared-secret-123")).local_token == "declared-secret-123"
    with pytest.raises(AccessError, match="FRESHPLAN_TOKEN") as caught:
        load_access(Settings(state_dir=tmp_path, token="short"))
    assert "short" not in str(caught.value)


def test_a_callers_file_replaces_the_local_secret(tmp_path):
    path = tmp_path / "callers.json"
    path.write_text(json.dumps({"callers": []}))
    access = load_access(Settings(state_dir=tmp_path, callers_file=path))
    assert access.local_token is None and access.callers() == () and access.reload is not None
    path.write_text('{"callers": [\n  {"id": "a", "secret_sha256": "00"}]}')
    with pytest.raises(AccessError, match=r"line 2: callers\[0\]\.secret_sha256"):
        load_access(Settings(state_dir=tmp_path, callers_file=path))
    with pytest.raises(AccessError, match="FRESHPLAN_METRICS_AUTH"):
        load_access(Settings(state_dir=tmp_path, metrics_auth="closed"))
    with pytest.raises(AccessError, match="FRESHPLAN_JWT_ISSUER"):
        load_access(Settings(state_dir=tmp_path, jwt_jwks_file=path, jwt_audience="x"))


def test_run_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "run.json"
    path.write_text("{}")
    path.chmod(0o644)
    write_run_file(path, {"http": "x"})
    assert read_run_file(path) == {"http": "x"} and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_run_file(tmp_path / "missing.json") == {}
