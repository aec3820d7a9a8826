"""Who may call the HTTP API: the callers file (secret hashes, principals, scopes), checked and reloaded."""

from __future__ import annotations

import hashlib
import hmac
import json
import json.decoder
import json.scanner
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCOPES = ("select", "plans", "receipts", "status", "admin")
_FIELDS = {"id", "secret_sha256", "principals", "scopes"}
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CallersFileError(ValueError):
    """A callers file that cannot be used; the message names the file, line and field (never a value)."""


@dataclass(frozen=True)
class Caller:
    """One authenticated party and what it may do."""

    id: str
    """Name shown in audit lines and logs."""
    principals: frozenset[str]
    """Principals it may ask for; "*" means any."""
    scopes: frozenset[str]
    """Routes it may use (see SCOPES)."""
    secret_sha256: bytes = b""
    """sha256 of its bearer secret (empty for JWT callers, which have no secret here)."""
    wildcard_allowed: bool = True
    """Whether "*" in `principals` means any: only for callers an operator wrote down, never for a JWT's claim."""

    def may_ask_for(self, principal: str) -> bool:
        """Whether a select (or a read of a plan or receipt) naming this principal is allowed."""
        return (self.wildcard_allowed and "*" in self.principals) or principal in self.principals

    def may_read(self, principal: str | None) -> bool:
        """Whether a plan or receipt of this principal may be shown; one whose principal is unknown only to a
        caller allowed any (an auditor)."""
        return self.wildcard_allowed and "*" in self.principals if principal is None else self.may_ask_for(principal)


def digest(secret: str) -> bytes:
    """The sha256 a callers file stores for a secret."""
    return hashlib.sha256(secret.encode("utf-8")).digest()


def match(callers: tuple[Caller, ...], secret: str) -> Caller | None:
    """The caller whose secret this is, comparing every hash in constant time."""
    presented = digest(secret)
    found = None
    for caller in callers:
        if hmac.compare_digest(caller.secret_sha256, presented) and found is None:
            found = caller
    return found


class _Located(dict):
    """A JSON object that remembers where in the text it starts."""

    start = 0


class _Decoder(json.JSONDecoder):
    """json with the start offset of every object, so errors can name a line."""

    def __init__(self) -> None:
        super().__init__()

        def parse_object(s_and_end, *args):
            obj, end = json.decoder.JSONObject(s_and_end, *args)
            located = _Located(obj)
            located.start = s_and_end[1] - 1
            return located, end

        self.parse_object = parse_object
        self.scan_once = json.scanner.py_make_scanner(self)  # the C scanner ignores parse_object


def parse(text: str, source: str = "callers file") -> tuple[Caller, ...]:
    """Callers from the file's text; CallersFileError names the line and field of the first problem."""
    try:
        doc = _Decoder().decode(text)
    except json.JSONDecodeError as exc:
        raise CallersFileError(f"{source} line {exc.lineno}: not JSON ({exc.msg})") from None

    def where(obj: Any, field: str | None = None) -> str:
        start = getattr(obj, "start", 0)
        if field is not None:
            at = text.find(f'"{field}"', start)
            start = at if at >= 0 else start
        return f"{source} line {text.count(chr(10), 0, start) + 1}"

    if not isinstance(doc, dict) or not isinstance(doc.get("callers"), list):
        raise CallersFileError(f"{where(doc)}: expected {{\"callers\": [...]}}")
    callers: list[Caller] = []
    seen_ids: set[str] = set()
    seen_secrets: set[bytes] = set()
    for n, item in enumerate(doc["callers"]):
        name = f"callers[{n}]"
        if not isinstance(item, dict):
            raise CallersFileError(f"{where(doc, 'callers')}: {name} must be an object")
        unknown = sorted(set(item) - _FIELDS)
        if unknown:
            raise CallersFileError(f"{where(item, unknown[0])}: {name}.{unknown[0]} is not a field "
                                   f"(use {', '.join(sorted(_FIELDS))})")
        cid = item.get("id")
        if not isinstance(cid, str) or not cid.strip():
            raise CallersFileError(f"{where(item, 'id')}: {name}.id must be a non-empty string")
        if cid in seen_ids:
            raise CallersFileError(f"{where(item, 'id')}: {name}.id duplicates an earlier caller's id")
        secret = item.get("secret_sha256")
        if not isinstance(secret, str) or not _HEX64.fullmatch(secret.lower()):
            raise CallersFileError(f"{where(item, 'secret_sha256')}: {name}.secret_sha256 must be 64 hex digits "
                                   "(sha256 of the secret, e.g. `printf %s SECRET | sha256sum`)")
        hashed = bytes.fromhex(secret)
        if hashed in seen_secrets:
            raise CallersFileError(f"{where(item, 'secret_sha256')}: {name}.secret_sha256 is shared with an "
                                   "earlier caller; give every caller its own secret")
        principals = item.get("principals")
        if not isinstance(principals, list) or not all(isinstance(p, str) and p.strip() for p in principals):
            raise CallersFileError(f"{where(item, 'principals')}: {name}.principals must be a list of "
                                   "principal names, [\"*\"] for any, or [] for none")
        scopes = item.get("scopes")
        if not isinstance(scopes, list) or not all(s in SCOPES for s in scopes):
            raise CallersFileError(f"{where(item, 'scopes')}: {name}.scopes must be a list drawn from "
                                   f"{', '.join(SCOPES)}")
        seen_ids.add(cid)
        seen_secrets.add(hashed)
        callers.append(Caller(cid, frozenset(p.strip() for p in principals), frozenset(scopes), hashed))
    return tuple(callers)


class CallersFile:
    """The callers named by FRESHPLAN_CALLERS_FILE; `reload()` swaps in a changed file only if it is valid."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._seen: bytes | None = None
        self.callers: tuple[Caller, ...] = ()
        self.last_error: str | None = None

    def load(self) -> tuple[Caller, ...]:
        """Read the file now; raise CallersFileError (start-up stops on it)."""
        raw = self._read()
        self._seen = hashlib.sha256(raw).digest()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CallersFileError(f"{self.path}: not UTF-8 text") from None
        self.callers = parse(text, str(self.path))
        return self.callers

    def reload(self) -> bool:
        """Re-read the file if it changed; keep the last good callers (and log why) if the new one is bad."""
        try:
            if hashlib.sha256(self._read()).digest() == self._seen:
                return False
            self.load()
        except CallersFileError as exc:
            if str(exc) != self.last_error:
                log.error("callers file change ignored, keeping the last good one: %s", exc,
                          extra={"code": "callers_file_invalid"})
            self.last_error = str(exc)
            return False
        self.last_error = None
        log.warning("callers file reloaded: %d callers", len(self.callers), extra={"callers": len(self.callers)})
        return True

    def _read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise CallersFileError(f"cannot read callers file {self.path}: {exc.strerror or exc}") from None
