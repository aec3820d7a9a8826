"""Kafka client security (TLS, SASL) from KAFKA_* settings, as aiokafka kwargs and Faust credentials."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class KafkaSecurityError(ValueError):
    """A KAFKA_* security setting that cannot work; the message names the variable."""


@dataclass(frozen=True)
class KafkaSecurity:
    """How every Kafka client of the process authenticates and encrypts; PLAINTEXT when unset."""

    protocol: str = "PLAINTEXT"
    """KAFKA_SECURITY_PROTOCOL: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, for every Kafka client (Faust's too)."""
    sasl_mechanism: str | None = None
    """KAFKA_SASL_MECHANISM: PLAIN (when unset), SCRAM-SHA-256 or SCRAM-SHA-512 (SASL protocols only)."""
    sasl_username: str | None = None
    """KAFKA_SASL_USERNAME: the Kafka principal of this service."""
    sasl_password: str | None = field(default=None, repr=False)
    """KAFKA_SASL_PASSWORD: never printed (excluded from repr)."""
    ssl_cafile: str | None = None
    """KAFKA_SSL_CAFILE: CA bundle that signed the brokers' certificates (system CAs when unset)."""
    ssl_certfile: str | None = None
    """KAFKA_SSL_CERTFILE: client certificate for mutual TLS."""
    ssl_keyfile: str | None = None
    """KAFKA_SSL_KEYFILE: private key of the client certificate."""

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "KafkaSecurity":
        """Read the KAFKA_* security variables (empty counts as unset)."""
        def get(name: str) -> str | None:
            return env.get(f"KAFKA_{name}") or None

        return cls(protocol=(get("SECURITY_PROTOCOL") or "PLAINTEXT").upper(),
                   sasl_mechanism=(get("SASL_MECHANISM") or "").upper() or None,
                   sasl_username=get("SASL_USERNAME"), sasl_password=get("SASL_PASSWORD"),
                   ssl_cafile=get("SSL_CAFILE"), ssl_certfile=get("SSL_CERTFILE"), ssl_keyfile=get("SSL_KEYFILE"))

    @property
    def uses_sasl(self) -> bool:
        """Whether the protocol authenticates with SASL."""
        return self.protocol.startswith("SASL_")

    @property
    def uses_ssl(self) -> bool:
        """Whether the protocol encrypts with TLS."""
        return self.protocol in ("SSL", "SASL_SSL")

    def validate(self) -> None:
        """Raise KafkaSecurityError naming the variable that is wrong or missing."""
        if self.protocol not in PROTOCOLS:
            raise KafkaSecurityError(f"KAFKA_SECURITY_PROTOCOL must be one of {', '.join(PROTOCOLS)}")
        if self.uses_sasl:
            if (self.sasl_mechanism or "PLAIN") not in MECHANISMS:
                raise KafkaSecurityError(f"KAFKA_SASL_MECHANISM must be one of {', '.join(MECHANISMS)}")
            if not self.sasl_username or not self.sasl_password:
                raise KafkaSecurityError(f"{self.protocol} needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD")
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password:
            raise KafkaSecurityError("KAFKA_SASL_* is set but KAFKA_SECURITY_PROTOCOL is "
                                     f"{self.protocol}; use SASL_SSL (or SASL_PLAINTEXT)")
        if not self.uses_ssl and (self.ssl_cafile or self.ssl_certfile or self.ssl_keyfile):
            raise KafkaSecurityError("KAFKA_SSL_* is set but KAFKA_SECURITY_PROTOCOL is "
                                     f"{self.protocol}; use SSL or SASL_SSL")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise KafkaSecurityError("set KAFKA_SSL_CERTFILE and KAFKA_SSL_KEYFILE together")
        if self.uses_ssl:
            self.ssl_context()  # unreadable files fail here, at start-up, not on the first connection

    def ssl_context(self) -> ssl.SSLContext | None:
        """A verifying client TLS context, or None without TLS."""
        if not self.uses_ssl:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ssl_cafile)
            if self.ssl_certfile:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise KafkaSecurityError(f"cannot load KAFKA_SSL_CAFILE/CERTFILE/KEYFILE: {exc.strerror or exc}") from None
        return context

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for every aiokafka consumer, producer and admin client."""
        if self.protocol == "PLAINTEXT":
            return {}
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_ssl:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            kwargs.update(sasl_mechanism=self.sasl_mechanism or "PLAIN", sasl_plain_username=self.sasl_username,
                          sasl_plain_password=self.sasl_password)
        return kwargs

    def faust_credentials(self) -> Any:
        """The same settings as Faust's `broker_credentials` (None for PLAINTEXT)."""
        import faust  # only the worker needs Faust; the helpers above serve every client

        if self.protocol == "PLAINTEXT":
            return None
        if self.uses_sasl:
            return faust.SASLCredentials(username=self.sasl_username, password=self.sasl_password,
                                         ssl_context=self.ssl_context(), mechanism=self.sasl_mechanism or "PLAIN")
        return faust.SSLCredentials(self.ssl_context())
