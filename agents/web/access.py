"""Who may call a worker: the callers file, or the local secret kept in run.json; plus end-user JWTs and token keys."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from agents.web.callers import SCOPES, Caller, CallersFile, CallersFileError, digest
from agents.web.token_keys import TokenKeyError, TokenKeys
from agents.web.tokens import JwtConfigError, JwtVerifier
from streams.settings import Settings

LOCAL_CALLER = "local"
MIN_TOKEN_CHARS = 16


class AccessError(ValueError):
    """A setting or file about callers that stops `freshplan run`; the message says what to fix."""


@dataclass(frozen=True)
class Access:
    """The callers a worker accepts right now, and how to refresh them."""

    callers: Callable[[], tuple[Caller, ...]]
    """The current callers (the callers file's last good version, or the one local caller)."""
    reload: Callable[[], bool] | None
    """Re-read the callers file and the token key file if they changed (None: nothing to re-read)."""
    jwt: JwtVerifier | None
    """End-user JWT verification, when configured."""
    local_token: str | None
    """The secret of the local caller, written to run.json; None with a callers file."""
    token_keys: TokenKeys = field(default_factory=TokenKeys.ephemeral)
    """The keys that sign and check freshness tokens (FRESHPLAN_TOKEN_KEY_FILE, shared by the group's workers)."""

    @classmethod
    def closed(cls) -> "Access":
        """Nobody may call (for workers built without settling access); tokens signed by a key of its own."""
        return cls(lambda: (), None, None, None)


def load_access(settings: Settings) -> Access:
    """Settle access at start-up; AccessError (with the file, line and field) stops the worker."""
    if settings.metrics_auth not in ("open", "status"):
        raise AccessError("FRESHPLAN_METRICS_AUTH must be open or status")
    try:
        jwt = JwtVerifier.from_files(settings.jwt_jwks_file, settings.jwt_issuer, settings.jwt_audience,
                                     settings.jwt_principal_claim)
    except JwtConfigError as exc:
        raise AccessError(str(exc)) from None
    try:
        keys = TokenKeys(settings.token_keys_path).ensure()
    except TokenKeyError as exc:
        raise AccessError(str(exc)) from None
    if settings.callers_file is not None:
        source = CallersFile(settings.callers_file)
        try:
            source.load()
        except CallersFileError as exc:
            raise AccessError(str(exc)) from None
        return Access(lambda: source.callers, lambda: _each(source.reload, keys.reload), jwt, None, keys)
    token = settings.token or read_run_file(settings.run_file).get("token") or secrets.token_urlsafe(32)
    if len(token) < MIN_TOKEN_CHARS or not token.isascii() or any(c in token for c in ". \t"):
        raise AccessError(f"FRESHPLAN_TOKEN must be at least {MIN_TOKEN_CHARS} printable ASCII characters "
                          "without spaces or dots")
    local = (Caller(LOCAL_CALLER, frozenset({"*"}), frozenset(SCOPES), digest(token)),)
    return Access(lambda: local, keys.reload, jwt, token, keys)


def _each(*reloads: Callable[[], bool]) -> bool:
    """Run every reload even if one fails: a broken key file must never delay removing a caller."""
    changed, failed = False, None
    for reload in reloads:
        try:
            changed = reload() or changed
        except Exception as exc:  # noqa: BLE001 - re-raised below, once every reload has had its turn
            failed = failed or exc
    if failed is not None:
        raise failed
    return changed


def read_run_file(path: Path) -> dict:
    """What the last `freshplan run` recorded (empty when there is none)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_run_file(path: Path, info: dict) -> None:
    """Replace run.json atomically, readable by its owner only (it may hold the local secret)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(info, out)
    os.replace(tmp, path)
