"""The callers file: parsed strictly with line and field in every error; a bad edit keeps the last good file."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest

from agents.web.callers import CallersFile, CallersFileError, match, parse


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


GOOD = {"callers": [
    {"id": "support-gateway", "secret_sha256": sha("gateway-secret-0001"), "principals": ["sam", "lee"],
     "scopes": ["select", "plans"]},
    {"id": "credit-desk", "secret_sha256": sha("desk-secret-000001"), "principals": ["*"],
     "scopes": ["select", "plans", "receipts"]},
    {"id": "ops", "secret_sha256": sha("ops-secret-00000001"), "principals": [], "scopes": ["admin", "status"]}]}


def test_callers_are_matched_by_secret_and_kept_to_their_principals():
    callers = parse(json.dumps(GOOD, indent=2))
    gateway = match(callers, "gateway-secret-0001")
    assert gateway.id == "support-gateway" and gateway.may_ask_for("sam") and not gateway.may_ask_for("maya")
    assert match(callers, "desk-secret-000001").may_ask_for("anyone")
    assert not match(callers, "ops-secret-00000001").may_ask_for("sam")
    assert match(callers, "guess") is None and match(callers, "") is None


def test_only_a_written_down_caller_may_use_the_wildcard():
    from agents.web.callers import Caller

    literal = Caller("jwt", frozenset({"*"}), frozenset({"select"}), wildcard_allowed=False)
    assert not literal.may_ask_for("maya") and literal.may_ask_for("*")
    assert Caller("desk", frozenset({"*"}), frozenset({"select"})).may_ask_for("maya")


def line_of(text: str, key: str, nth: int) -> int:
    """1-based line of the nth occurrence of `"key":` in text."""
    at = -1
    for _ in range(nth + 1):
        at = text.index(f'"{key}":', at + 1)
    return text.count("\n", 0, at) + 1


@pytest.mark.parametrize("mutate, key, nth, field", [
    (lambda d: d["callers"][1].update(scopes=["select", "admn"]), "scopes", 1, "callers[1].scopes"),
    (lambda d: d["callers"][2].update(id="support-gateway"), "id", 2, "callers[2].id duplicates"),
    (lambda d: d["callers"][0].update(secret_sha256="abc"), "secret_sha256", 0, "callers[0].secret_sha256"),
    (lambda d: d["callers"][2].update(secret_sha256=d["callers"][0]["secret_sha256"]), "secret_sha256", 2, "shared"),
    (lambda d: d["callers"][1].update(principals="*"), "principals", 1, "callers[1].principals"),
    (lambda d: d["callers"][0].update(scope=["select"]), "scope", 0, "callers[0].scope is not a field"),
])
def test_errors_name_the_line_and_the_field(mutate, key, nth, field):
    doc = json.loads(json.dumps(GOOD))
    mutate(doc)
    text = json.dumps(doc, indent=2)
    line = line_of(text, key, nth)
    assert line > 3
    with pytest.raises(CallersFileError) as caught:
        parse(text, "callers.json")
    message = str(caught.value)
    assert f"callers.json line {line}:" in message and field in message, message
    assert all(c["secret_sha256"] not in message for c in GOOD["callers"])


def test_broken_json_names_its_line():
    text = json.dumps(GOOD, indent=2).replace('"ops"', '"ops",,', 1)
    with pytest.raises(CallersFileError, match=rf"callers.json line {line_of(text, 'id', 2)}: not JSON"):
        parse(text, "callers.json")
    with pytest.raises(CallersFileError, match="expected"):
        parse("[]", "callers.json")


def test_a_bad_edit_keeps_the_last_good_callers_and_says_why(tmp_path, caplog):
    path = tmp_path / "callers.json"
    path.write_text(json.dumps(GOOD))
    source = CallersFile(path)
    assert len(source.load()) == 3 and source.reload() is False  # unchanged
    path.write_text(json.dumps({"callers": GOOD["callers"][:1]}))
    assert source.reload() is True and [c.id for c in source.callers] == ["support-gateway"]
    with caplog.at_level(logging.ERROR, logger="agents.web.callers"):
        path.write_text('{"callers": [{"id": 1}]}')
        assert source.reload() is False
        path.unlink()
        assert source.reload() is False
    assert [c.id for c in source.callers] == ["support-gateway"]
    assert "callers[0].id" in caplog.text and "cannot read" in caplog.text
    path.write_text(json.dumps(GOOD))
    assert source.reload() is True and len(source.callers) == 3
