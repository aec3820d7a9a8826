"""End-user JWTs: RS256 and ES256 accepted; expired, early, forged, foreign, alg none and HS256 refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest

from agents.web.tokens import JwtConfigError, JwtRefused, JwtVerifier, looks_like_jwt
from tests.jwt_keys import AUDIENCE, ISSUER, make_signers, unsigned, write_jwks


@pytest.fixture(scope="module")
def signers():
    return make_signers()


@pytest.fixture
def verifier(signers, tmp_path):
    return JwtVerifier.from_files(write_jwks(tmp_path / "jwks.json", *signers), ISSUER, AUDIENCE)


def b64(doc: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def refused(verifier, token) -> str:
    with pytest.raises(JwtRefused) as caught:
        verifier.verify(token)
    return caught.value.reason


def test_rs256_and_es256_tokens_name_their_subject(verifier, signers):
    rsa, ec = signers
    assert verifier.verify(rsa.token("sam")) == "sam"
    assert verifier.verify(ec.token("maya")) == "maya"
    assert looks_like_jwt(rsa.token()) and not looks_like_jwt("plain-secret-without-dots")


def test_another_principal_claim(signers, tmp_path):
    custom = JwtVerifier.from_files(write_jwks(tmp_path / "jwks.json", *signers), ISSUER, AUDIENCE, "employee")
    assert custom.verify(signers[0].token(None, employee="lee")) == "lee"
    assert refused(custom, signers[0].token("lee")) == "invalid"  # the configured claim is required


def test_time_issuer_and_audience_are_checked(verifier, signers):
    rsa, _ = signers
    assert refused(verifier, rsa.token(lifetime=-10)) == "expired"
    assert refused(verifier, rsa.token(nbf=int(time.time()) + 600)) == "not_yet_valid"
    assert refused(verifier, rsa.token(iss="https://evil.test")) == "wrong_issuer_or_audience"
    assert refused(verifier, rsa.token(aud="someone-else")) == "wrong_issuer_or_audience"
    assert refused(verifier, rsa.token(exp=None)) == "invalid"


def test_forged_unsigned_and_confused_tokens_are_refused(verifier, signers):
    rsa, ec = signers
    stranger = make_signers()[0]
    assert refused(verifier, stranger.token("sam")) == "bad_signature"  # same kid, another key
    assert refused(verifier, unsigned()) == "algorithm_not_allowed"
    # HS256 keyed with the public JWK (the classic algorithm confusion), signed by hand
    public = json.dumps(rsa.public_jwk()).encode()
    signing_input = f"{b64({'alg': 'HS256', 'kid': 'rsa-1'})}.{b64({'sub': 'sam'})}"
    mac = base64.urlsafe_b64encode(hmac.new(public, signing_input.encode(), hashlib.sha256).digest())
    assert refused(verifier, f"{signing_input}.{mac.rstrip(b'=').decode()}") == "algorithm_not_allowed"
    # a valid signature with its payload swapped for another subject
    head, _, sig = rsa.token("sam").split(".")
    swapped = b64({"iss": ISSUER, "aud": AUDIENCE, "sub": "maya", "exp": int(time.time()) + 60})
    assert refused(verifier, f"{head}.{swapped}.{sig}") == "bad_signature"
    assert refused(verifier, jwt.encode({"sub": "sam", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60},
                                        ec.key, algorithm="ES256", headers={"kid": "nope"})) == "unknown_key"
    assert refused(verifier, "not.a.jwt") == "malformed"


def test_settings_must_come_together_and_the_jwks_must_be_usable(tmp_path, signers):
    assert JwtVerifier.from_files(None, None, None) is None
    with pytest.raises(JwtConfigError, match="FRESHPLAN_JWT_AUDIENCE"):
        JwtVerifier.from_files(write_jwks(tmp_path / "k.json", *signers), ISSUER, None)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(JwtConfigError, match="not JSON"):
        JwtVerifier.from_files(tmp_path / "bad.json", ISSUER, AUDIENCE)
    (tmp_path / "empty.json").write_text('{"keys": []}')
    with pytest.raises(JwtConfigError, match="no RS256 or ES256 key"):
        JwtVerifier.from_files(tmp_path / "empty.json", ISSUER, AUDIENCE)
