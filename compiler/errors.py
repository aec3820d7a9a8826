"""Typed request errors, one code per pass, each with a sentence a caller can act on."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the compiler refuses; `code` is machine-readable, `status` the HTTP status."""

    pass_name = "request"

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def as_dict(self) -> dict:
        """The JSON error body returned to HTTP callers."""
        return {"error": {"code": self.code, "pass": self.pass_name, "message": self.message}}


class ParseError(RequestError):
    """Pass 1: the request itself is malformed."""

    pass_name = "parse"


class ResolveError(RequestError):
    """Pass 2: a name does not resolve to exactly one canonical id."""

    pass_name = "resolve"


class TypeCheckError(RequestError):
    """Pass 3: the decision type or purpose is not in the current catalogue."""

    pass_name = "type-check"


class AdmitError(RequestError):
    """Pass 4: no admission is possible under the current policy for this request."""

    pass_name = "admit"


class PlanError(RequestError):
    """Pass 5: the request leaves the planner nothing it could select."""

    pass_name = "plan"


class AttestError(RequestError):
    """Pass 6: the plan cannot be attested against the state the caller requires."""

    pass_name = "attest"


class PolicyError(ValueError):
    """A Cedar bundle that does not parse; the previous version stays active."""
