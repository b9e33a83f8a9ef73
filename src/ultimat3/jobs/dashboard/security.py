"""What keeps the dashboard safe to open: basic auth, the CSRF check, the response headers, and
the rule that a non-loopback bind needs auth.

- **Auth.** ``BasicAuth`` checks every request (constant-time comparison). Mounted in a host
  application, the dashboard may instead sit behind the host's own auth (``auth=None``); the
  ``ultimat3-jobs dashboard`` command refuses a non-loopback address unless basic auth is
  configured from the environment (``BasicAuth.from_env``).
- **CSRF.** A double-submit token: a random value in an ``HttpOnly``, ``SameSite=Strict``
  cookie, repeated in a hidden field of every form; a POST whose field does not equal its
  cookie is refused with 403 before anything is read from it. No GET changes state.
- **Headers.** A Content-Security-Policy that allows only the dashboard's own script and
  stylesheet (no inline script or style: htmx is configured by a ``<meta>`` tag, with eval and
  its inline indicator styles off), no framing, no referrer leaving the origin.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass, field

from ultimat3.jobs.errors import ConfigurationError

__all__ = [
    "CSP",
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "ENV_PASSWORD",
    "ENV_USER",
    "BasicAuth",
    "check_bind",
    "csrf_matches",
    "is_loopback",
    "new_csrf_token",
]

ENV_USER = "ULTIMAT3_JOBS_DASHBOARD_USER"
ENV_PASSWORD = "ULTIMAT3_JOBS_DASHBOARD_PASSWORD"

CSRF_COOKIE = "ultimat3_jobs_csrf"
CSRF_FIELD = "csrf"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

#: Headers on every response.
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
}


@dataclass(frozen=True)
class BasicAuth:
    """HTTP basic auth with one user name and password (compared in constant time)."""

    username: str
    password: str = field(repr=False)
    realm: str = "ultimat3-jobs"

    def __post_init__(self) -> None:
        if not self.username or not self.password:
            raise ConfigurationError(
                "BasicAuth needs a user name and a password, both non-empty",
                fix=f"set ${ENV_USER} and ${ENV_PASSWORD}, or pass BasicAuth(username, password)",
            )
        if ":" in self.username:
            raise ConfigurationError(
                f"BasicAuth user name {self.username!r} contains ':', which basic auth cannot carry",
                fix="choose a user name without ':'",
            )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> BasicAuth | None:
        """The auth ``$ULTIMAT3_JOBS_DASHBOARD_USER`` and ``$ULTIMAT3_JOBS_DASHBOARD_PASSWORD``
        configure, or None when neither is set. One without the other is an error."""
        env = os.environ if environ is None else environ
        user, password = env.get(ENV_USER, ""), env.get(ENV_PASSWORD, "")
        if not user and not password:
            return None
        if not user or not password:
            missing = ENV_PASSWORD if user else ENV_USER
            raise ConfigurationError(
                f"${missing} is not set (or empty), but its partner is: basic auth needs both",
                fix=f"set both ${ENV_USER} and ${ENV_PASSWORD}, or neither",
            )
        return cls(user, password)

    def accepts(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries this user and password."""
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        if not sep:
            return False
        # Both compared every time, so the time taken says nothing about which one was wrong.
        ok_user = hmac.compare_digest(user.encode(), self.username.encode())
        ok_password = hmac.compare_digest(password.encode(), self.password.encode())
        return ok_user and ok_password


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_matches(cookie: str | None, submitted: str | None) -> bool:
    if not cookie or not submitted:
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only listens on this machine."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: BasicAuth | None) -> None:
    """Refuse to serve beyond this machine without auth."""
    if auth is None and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host!r} without auth: anyone who can reach "
            "that address could retry, discard and pause jobs",
            fix=f"set ${ENV_USER} and ${ENV_PASSWORD} (basic auth), or bind 127.0.0.1 "
            "(the default) behind a proxy that authenticates",
        )
