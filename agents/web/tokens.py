"""End-user JWTs (RS256, ES256) verified with PyJWT against a JWKS file; the subject is the only principal."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jwt

ALGORITHMS = ("RS256", "ES256")
_KEY_TYPES = {"RS256": "RSA", "ES256": "EC"}


class JwtConfigError(ValueError):
    """JWT settings or JWKS file that cannot work; start-up stops with this message."""


class JwtRefused(Exception):
    """A token that is not a valid end-user JWT; `reason` is a class, never the token or its claims."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def looks_like_jwt(token: str) -> bool:
    """Three dot-separated parts; generated and declared secrets never contain dots."""
    return token.count(".") == 2


@dataclass(frozen=True)
class JwtVerifier:
    """Checks signature, exp, nbf, iss and aud; returns the principal claim."""

    keys: tuple[jwt.PyJWK, ...]
    """Public keys from the JWKS file."""
    issuer: str
    """Required `iss`."""
    audience: str
    """Required `aud` (one of, when the token lists several)."""
    principal_claim: str = "sub"
    """Claim holding the end user's principal."""

    @classmethod
    def from_files(cls, jwks_file: Path | None, issuer: str | None, audience: str | None,
                   principal_claim: str = "sub") -> "JwtVerifier | None":
        """None when no JWT setting is given; JwtConfigError when only some are, or the JWKS is unusable."""
        given = {"FRESHPLAN_JWT_JWKS_FILE": jwks_file, "FRESHPLAN_JWT_ISSUER": issuer,
                 "FRESHPLAN_JWT_AUDIENCE": audience}
        if not any(given.values()):
            return None
        missing = [name for name, value in given.items() if not value]
        if missing:
            raise JwtConfigError(f"end-user JWTs need {', '.join(missing)} as well")
        try:
            doc = json.loads(Path(jwks_file).read_text("utf-8"))
        except OSError as exc:
            raise JwtConfigError(f"cannot read FRESHPLAN_JWT_JWKS_FILE {jwks_file}: {exc.strerror}") from None
        except ValueError as exc:
            raise JwtConfigError(f"FRESHPLAN_JWT_JWKS_FILE {jwks_file} is not JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise JwtConfigError(f"FRESHPLAN_JWT_JWKS_FILE {jwks_file}: expected {{\"keys\": [...]}}")
        keys = []
        for n, item in enumerate(doc["keys"]):
            try:
                key = jwt.PyJWK(item)
            except (jwt.PyJWKError, jwt.InvalidKeyError, TypeError, ValueError) as exc:
                raise JwtConfigError(f"FRESHPLAN_JWT_JWKS_FILE {jwks_file}: keys[{n}] is not a usable "
                                     f"public key ({type(exc).__name__})") from None
            if key.algorithm_name in ALGORITHMS:
                keys.append(key)
        if not keys:
            raise JwtConfigError(f"FRESHPLAN_JWT_JWKS_FILE {jwks_file} has no RS256 or ES256 key")
        return cls(tuple(keys), issuer, audience, principal_claim)

    def verify(self, token: str) -> str:
        """The token's principal; JwtRefused when anything about it is wrong."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise JwtRefused("malformed") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:  # "none", HS256 with a public key as secret, and the rest
            raise JwtRefused("algorithm_not_allowed")
        key = self._key(header.get("kid"), alg)
        try:
            claims = jwt.decode(token, key.key, algorithms=[alg], audience=self.audience, issuer=self.issuer,
                                options={"require": ["exp", "iss", "aud", self.principal_claim]})
        except jwt.ExpiredSignatureError:
            raise JwtRefused("expired") from None
        except jwt.ImmatureSignatureError:
            raise JwtRefused("not_yet_valid") from None
        except jwt.InvalidSignatureError:
            raise JwtRefused("bad_signature") from None
        except (jwt.InvalidIssuerError, jwt.InvalidAudienceError):
            raise JwtRefused("wrong_issuer_or_audience") from None
        except jwt.PyJWTError:
            raise JwtRefused("invalid") from None
        principal = claims.get(self.principal_claim)
        if not isinstance(principal, str) or not principal.strip():
            raise JwtRefused("no_principal")
        return principal.strip()

    def _key(self, kid: object, alg: str) -> jwt.PyJWK:
        candidates = [k for k in self.keys if k.algorithm_name == alg and k.key_type == _KEY_TYPES[alg]]
        if kid is not None:
            candidates = [k for k in candidates if k.key_id == kid]
        if len(candidates) != 1:  # no key, or several without a kid to choose: refuse rather than guess
            raise JwtRefused("unknown_key")
        return candidates[0]
