"""The token key file: made 0600 on first start, shared, rotated with a grace, a bad edit keeps the last good keys."""

from __future__ import annotations

import json
import logging
import stat

import pytest

from agents.web.token_keys import TokenKeyError, TokenKeys, rotate
from schemas.freshness import BadToken, encode_token, read_token

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_the_first_start_makes_a_private_key_file_and_later_starts_keep_it(tmp_path):
    path = tmp_path / "state" / "token-keys.json"
    first = TokenKeys(path).ensure()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first.keys) == 1
    again = TokenKeys(path).ensure()  # another worker sharing the file, or a restart
    assert again.sign_with() == first.sign_with() and len(first.sign_with()) == 32
    assert TokenKeys(tmp_path / "elsewhere.json").ensure().sign_with() != first.sign_with()
    path.chmod(0o644)
    with pytest.raises(TokenKeyError, match="chmod 600"):
        TokenKeys(path).load()


def test_a_rotation_accepts_the_new_key_at_once_signs_with_it_later_and_retires_the_old_after_the_grace(tmp_path):
    path = tmp_path / "token-keys.json"
    clock = Clock()
    worker = TokenKeys(path, clock).ensure()
    old = worker.sign_with()
    issued_before = encode_token({"revocations": {0: 1}}, "c", 0, key=old)
    rotate(path, grace=600, sign_delay=10, now=clock.now)
    assert worker.reload() is True
    new = next(k.secret for k in worker.keys if k.secret != old)
    assert worker.sign_with() == old and new in worker.accepted()  # accepted before any worker signs with it
    clock.now += 10
    assert worker.sign_with() == new and old in worker.accepted()
    read_token(issued_before, worker.accepted())  # within the grace
    clock.now += 600
    assert worker.accepted() == (new,)
    with pytest.raises(BadToken):
        read_token(issued_before, worker.accepted())
    rotate(path, grace=600, sign_delay=10, now=clock.now)  # the retired key is dropped from the file
    assert old not in [k["secret"] for k in json.loads(path.read_text())["keys"]]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_bad_edit_of_the_key_file_keeps_the_last_good_keys_and_says_so_once(tmp_path, caplog):
    path = tmp_path / "token-keys.json"
    keys = TokenKeys(path).ensure()
    good = keys.sign_with()
    path.write_text('{"keys": [{"secret": "zz"}]}')
    with caplog.at_level(logging.ERROR, logger="agents.web.token_keys"):
        assert keys.reload() is False and keys.reload() is False
    assert keys.sign_with() == good
    errors = [r.getMessage() for r in caplog.records if "token key file change ignored" in r.getMessage()]
    assert len(errors) == 1 and "keys[0].secret" in errors[0] and good.hex() not in caplog.text
    with pytest.raises(TokenKeyError):
        TokenKeys(path).load()  # and a start on it stops, naming the field
