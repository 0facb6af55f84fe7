"""Why a connection attempt to the broker failed, in words an operator can act on.

paho-mqtt 2.2 reports a failed attempt in one of three ways; each has its function here:

* `from_exception`: opening the TCP or TLS connection raised (DNS, refused, TLS
  verification, timeout, reset).  paho calls on_connect_fail from inside its
  `except OSError:` around reconnect() (loop_forever), so the callback still sees the
  exception through sys.exc_info(); paho passes it nowhere else.
* `from_connack`: the broker answered CONNACK with a failure (not authorised, ...).
* `from_early_close`: the connection closed before any CONNACK (paho's keepalive timer
  gave up waiting, or the broker hung up: plain MQTT sent to a TLS port, ...).

The texts are stable for a repeated identical failure (no counters, no addresses that
change), so the publisher can log once per change of reason.
"""

from __future__ import annotations

import logging
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# CONNACK reason codes that mean the configuration is wrong, not the network
AUTH_REFUSALS = {134, 135, 140}  # bad user name or password, not authorized, bad authentication method
_CONFIG_REFUSALS = AUTH_REFUSALS | {133}  # 133: client identifier not valid
_KEEPALIVE_TIMEOUT = 141  # paho's reason when its keepalive timer closes the socket


@dataclass(frozen=True)
class Failure:
    kind: str  # tls-verification, tls, dns, refused, timeout, reset, network, not-authorised, broker-refused, closed
    text: str
    config: bool = False  # retrying cannot help: wait_connected raises ConfigError

    @property
    def level(self) -> int:
        return logging.ERROR if self.config else logging.WARNING


@dataclass(frozen=True)
class Endpoint:
    """What the texts name: the broker and the settings that decide how we reach it."""

    host: str
    port: int
    tls: bool
    ca: Path | None
    username: str | None
    keepalive_s: int
    connect_timeout_s: float

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


def from_exception(exc: BaseException | None, at: Endpoint) -> Failure:
    """A failed TCP/TLS connect (order matters: SSL errors are OSErrors, timeouts too)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        ca = f"mqtt.tls.ca={at.ca}" if at.ca else "the system's CA certificates"
        return Failure(
            "tls-verification",
            f"TLS verification failed against {ca}: certificate verify failed: {exc.verify_message}",
        )
    if isinstance(exc, ssl.SSLError):
        return Failure("tls", f"TLS handshake failed: {exc.reason or exc}{_tls_hint(at)}")
    if isinstance(exc, socket.gaierror):
        return Failure("dns", f"DNS lookup of {at.host!r} failed: {exc.strerror}")
    if isinstance(exc, ConnectionRefusedError):
        return Failure("refused", f"connection refused: nothing accepts connections on {at.where}")
    if isinstance(exc, TimeoutError):
        step = "TCP/TLS connect" if at.tls else "TCP connect"
        return Failure("timeout", f"timeout: no answer from {at.where} within {at.connect_timeout_s:g} s ({step})")
    if isinstance(exc, ConnectionResetError):
        return Failure("reset", f"connection reset by {at.where} while connecting{_tls_hint(at)}")
    if isinstance(exc, OSError):
        return Failure("network", f"network error: {exc.strerror or exc}")
    return Failure("unknown", f"connection failed ({exc!r})" if exc else "connection failed (paho gave no reason)")


def from_connack(reason: Any, at: Endpoint) -> Failure:
    """A CONNACK with a failure reason code (paho's ReasonCode)."""
    code = f"{reason} (MQTT reason code {reason.value})"
    if reason.value in AUTH_REFUSALS:
        user = at.username or "(none: mqtt.username is not set)"
        return Failure(
            "not-authorised",
            f"not authorised: mqtt.username/mqtt.password_file: broker {at.where} refused user {user}: {code}",
            config=True,
        )
    return Failure(
        "broker-refused",
        f"broker {at.where} refused the connection: {code}",
        config=reason.value in _CONFIG_REFUSALS,
    )


def from_early_close(reason: Any, at: Endpoint) -> Failure:
    """The connection closed after the TCP/TLS connect but before any CONNACK."""
    if reason.value == _KEEPALIVE_TIMEOUT:
        return Failure(
            "timeout",
            f"timeout: {at.where} accepted the connection but sent no CONNACK within "
            f"mqtt.keepalive_s={at.keepalive_s} s (is it an MQTT broker?)",
        )
    hint = "" if at.tls else " (a TLS port? then set mqtt.tls.ca)"
    return Failure("closed", f"{at.where} closed the connection before CONNACK: {reason}{hint}")


def _tls_hint(at: Endpoint) -> str:
    return " (is the port a plain MQTT port? then mqtt.tls.enabled: false)" if at.tls else ""
