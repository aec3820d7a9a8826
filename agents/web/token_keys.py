"""The keys that sign freshness tokens: a 0600 file made on first start, re-read every second, rotated with a grace."""

from __future__ import annotations

import hashlib
import json
import math
import logging
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

SIGN_DELAY_SECONDS = 10.0
"""After a rotation, how long the new key is only accepted: every worker re-reads the file (each second) first."""
DEFAULT_GRACE_SECONDS = 86_400.0
"""How long a retired key is still accepted after a rotation (tokens it signed keep working that long)."""


_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")


class TokenKeyError(ValueError):
    """A token key file that cannot be used; the message names the file and what to do (never a key)."""


@dataclass(frozen=True)
class TokenKey:
    """One HMAC-SHA256 key and the window in which it signs and is accepted."""

    secret: bytes
    signs_from: float
    """Unix time from which it may sign (a rotated-in key waits SIGN_DELAY_SECONDS)."""
    accepted_until: float | None
    """Unix time after which tokens it signed are refused; None: the current key, no end set."""


def _instant(value: object, where: str) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TokenKeyError(f"{where} must be an RFC 3339 time such as 2026-12-01T09:00:00Z") from None


def _text(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(raw: bytes, source: str) -> tuple[TokenKey, ...]:
    """The keys of a key file's bytes; TokenKeyError names the entry and field of the first problem."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # a file nested past the parser's depth is as unreadable
        raise TokenKeyError(f"{source} is not JSON; restore it from a copy or run `freshplan tokens rotate`") from None
    items = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise TokenKeyError(f"{source}: expected {{\"keys\": [...]}} with at least one key")
    keys = []
    for n, item in enumerate(items):
        where = f"{source} keys[{n}]"
        secret = item.get("secret") if isinstance(item, dict) else None
        # fromhex skips whitespace: 64 spaces would be an empty key, so the spelling is checked first
        if not isinstance(secret, str) or not _HEX_KEY.fullmatch(secret):
            raise TokenKeyError(f"{where}.secret must be 64 hex digits (32 random bytes)")
        value = bytes.fromhex(secret)
        until = item.get("accepted_until")
        keys.append(TokenKey(value, _instant(item.get("signs_from"), f"{where}.signs_from"),
                             None if until is None else _instant(until, f"{where}.accepted_until")))
    return tuple(keys)


def dump(keys: tuple[TokenKey, ...]) -> bytes:
    """A key file's bytes."""
    return json.dumps({"keys": [{"secret": k.secret.hex(), "signs_from": _text(k.signs_from),
                                 "accepted_until": None if k.accepted_until is None else _text(k.accepted_until)}
                                for k in keys]}, indent=2).encode() + b"\n"


def _write_new(path: Path, data: bytes, replace: bool) -> None:
    """Write a 0600 file: atomically replacing `path`, or only if it does not exist yet (two starts may race)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another worker sharing the file made it first: its key is the group's
    finally:
        tmp.unlink(missing_ok=True)


def rotate(path: Path, grace: float = DEFAULT_GRACE_SECONDS, sign_delay: float = SIGN_DELAY_SECONDS,
           now: float | None = None) -> tuple[TokenKey, ...]:
    """Add a new key that signs after `sign_delay`; every kept key ends at most `grace` after; expired are dropped.

    Every key, also one an earlier rotation retired, ends within the grace: `--grace 0` retires all at once
    (a leaked file leaks every key in it).
    """
    if not (math.isfinite(grace) and grace >= 0 and math.isfinite(sign_delay) and sign_delay >= 0):
        raise TokenKeyError("--grace and --sign-after must be finite numbers of seconds, 0 or more")
    now = time.time() if now is None else now
    current = TokenKeys(path, lambda: now).read()
    starts = now + sign_delay
    ends = starts + grace
    kept = tuple(TokenKey(k.secret, k.signs_from, ends if k.accepted_until is None else min(k.accepted_until, ends))
                 for k in current if k.accepted_until is None or k.accepted_until > now)
    keys = (TokenKey(secrets.token_bytes(32), starts, None),) + kept
    _write_new(path, dump(keys), replace=True)
    return keys


class TokenKeys:
    """The key file (FRESHPLAN_TOKEN_KEY_FILE): which key signs now, which are accepted; reloads keep the last good."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self.path = None if path is None else Path(path)
        self.clock = clock
        self.keys: tuple[TokenKey, ...] = ()
        self._seen: bytes | None = None
        self.last_error: str | None = None

    @classmethod
    def ephemeral(cls) -> "TokenKeys":
        """One random key in memory (a worker built without settled access: its tokens die with it)."""
        keys = cls(None)
        keys.keys = (TokenKey(secrets.token_bytes(32), 0.0, None),)
        return keys

    def ensure(self) -> "TokenKeys":
        """Create the file with one key if it does not exist (first start), then load it."""
        if not self.path.exists():
            _write_new(self.path, dump((TokenKey(secrets.token_bytes(32), self.clock(), None),)), replace=False)
        self.load()
        return self

    def read(self) -> tuple[TokenKey, ...]:
        """The file's keys, whether or not one signs now (what a rotation starts from)."""
        return parse(self._read(), str(self.path))

    def load(self) -> tuple[TokenKey, ...]:
        """Read the file now; TokenKeyError (start-up stops on it) when it is unreadable, open to others, or bad."""
        raw = self._read()
        keys = parse(raw, str(self.path))
        if self.signing_key(keys) is None:
            raise TokenKeyError(f"{self.path} has no key that signs now (each is retired or starts later); "
                                "run `freshplan tokens rotate`")
        # Only a file taken is remembered: one refused (say, a key that signs in a moment) is read again.
        self._seen = hashlib.sha256(raw).digest()
        self.keys = keys
        return keys

    def reload(self) -> bool:
        """Re-read the file if it changed; keep the last good keys (and log why, once) if the new file is bad."""
        try:
            if hashlib.sha256(self._read()).digest() == self._seen:
                return False
            self.load()
        except TokenKeyError as exc:
            if str(exc) != self.last_error:
                log.error("token key file change ignored, keeping the last good keys: %s", exc,
                          extra={"code": "token_key_file_invalid"})
            self.last_error = str(exc)
            return False
        self.last_error = None
        log.warning("token key file reloaded: %d keys", len(self.keys), extra={"keys": len(self.keys)})
        return True

    def signing_key(self, keys: tuple[TokenKey, ...] | None = None) -> bytes | None:
        """The key that signs now: the latest started of those open (None: none is)."""
        now = self.clock()
        live = [k for k in (self.keys if keys is None else keys)
                if k.signs_from <= now and (k.accepted_until is None or now < k.accepted_until)]
        return max(live, key=lambda k: k.signs_from).secret if live else None

    def sign_with(self) -> bytes:
        """The key to sign a token with now; the last to have signed once every key is past its window."""
        key = self.signing_key()
        return key if key is not None else max(self.keys, key=lambda k: k.signs_from).secret

    def accepted(self) -> tuple[bytes, ...]:
        """Keys whose tokens are accepted now (a rotated-in key is, before it signs)."""
        now = self.clock()
        return tuple(k.secret for k in self.keys if k.accepted_until is None or now < k.accepted_until)

    def _read(self) -> bytes:
        try:
            info = self.path.stat()
            if not stat.S_ISREG(info.st_mode):
                raise TokenKeyError(f"token key file {self.path} is not a regular file")
            if info.st_mode & 0o077:
                raise TokenKeyError(f"token key file {self.path} can be read by others; `chmod 600 {self.path}` "
                                    "(and rotate the keys if someone else may have read it)")
            return self.path.read_bytes()
        except OSError as exc:
            raise TokenKeyError(f"cannot read token key file {self.path}: {exc.strerror or exc}") from None
