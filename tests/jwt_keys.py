"""Test signing keys and JWTs: an RSA and an EC key pair, their JWKS, and a token factory."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

ISSUER = "https://idp.example.test"
AUDIENCE = "freshplan"


@dataclass(frozen=True)
class Signer:
    """One private key with its kid and algorithm."""

    kid: str
    alg: str
    key: object

    def public_jwk(self) -> dict:
        """The public half as a JWK."""
        public = self.key.public_key()
        algorithm = RSAAlgorithm if self.alg == "RS256" else ECAlgorithm
        return dict(algorithm.to_jwk(public, as_dict=True), kid=self.kid, alg=self.alg, use="sig")

    def token(self, sub: str | None = "sam", *, lifetime: float = 300, **claims) -> str:
        """A signed JWT for `sub` with the test issuer and audience (override any claim)."""
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + int(lifetime)}
        if sub is not None:
            body["sub"] = sub
        body.update(claims)
        return jwt.encode(body, self.key, algorithm=self.alg, headers={"kid": self.kid})


def make_signers() -> tuple[Signer, Signer]:
    """A fresh RS256 and ES256 signer."""
    return (Signer("rsa-1", "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
            Signer("ec-1", "ES256", ec.generate_private_key(ec.SECP256R1())))


def write_jwks(path: Path, *signers: Signer) -> Path:
    """A JWKS file with the signers' public keys."""
    path.write_text(json.dumps({"keys": [s.public_jwk() for s in signers]}))
    return path


def unsigned(sub: str = "sam") -> str:
    """A JWT with `alg: none`."""
    now = int(time.time())
    return jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now + 300}, None, algorithm="none")
