"""Redis connections with timeouts that suit each use, retries that ride out a broker restart, and
one clear error when a URL is unreachable or refuses our credentials.

A password, an ACL user and TLS all travel in the one URL, in the form both redis-py and Celery's
Redis transport read (docs/operations.md): `rediss://USER:PASS@HOST:PORT/0?ssl_cert_reqs=required
&ssl_ca_certs=CA.pem&ssl_certfile=CLIENT.pem&ssl_keyfile=CLIENT.key`.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from kombu.exceptions import OperationalError
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

# redis-py 8 sets a 5 s socket timeout by default; blocking reads need more than their block.
BLOCKING_SOCKET_TIMEOUT_S = 30.0
COMMAND_SOCKET_TIMEOUT_S = 10.0
# A command that meets a dropped connection reconnects and retries with backoff (capped at 1 s)
# this many times: about half a minute, enough for a broker restart. Every write the pipeline
# retries is idempotent or de-duplicated downstream (chunk ids, eval parts), so a retry that
# repeats a write the server had already applied is harmless.
RETRIES = 30


class RedisUnreachable(RuntimeError):
    """The Redis URL does not answer, or refuses the URL's credentials."""


# Every error the learner treats as a failure of the broker, so it can say `except BROKER_ERRORS`
# without importing redis: a Redis command's (the pipeline's own clients) and a Celery send's
# (kombu raises OperationalError once its connection retries are spent).
BROKER_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, OperationalError)


def broker_gone(exc: BaseException) -> bool:
    """Whether `exc` says the broker cannot be reached: the client already retried for the whole
    retry window (RETRIES), so retrying again is pointless. Other broker errors (a script busy, an
    out-of-memory reply) may pass."""
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError | OperationalError)


def redact(url: str) -> str:
    """`url` with any password replaced by `***`: for messages, logs and hints."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def celery_ssl(url: str) -> dict[str, Any] | None:
    """Celery's `broker_use_ssl` for `url`: for rediss:// verify the server's certificate, as
    redis-py does. Celery's Redis transport would otherwise connect without verifying when the URL
    names no ssl_* option; ssl_* options in the URL replace this whole dict."""
    return {"ssl_cert_reqs": ssl.CERT_REQUIRED} if url.startswith("rediss://") else None


def connect(url: str, *, blocking: bool = False, retries: int = RETRIES) -> redis.Redis:
    """A client for `url`, checked with PING; `blocking=True` for XREADGROUP BLOCK / BLPOP users."""
    timeout = BLOCKING_SOCKET_TIMEOUT_S if blocking else COMMAND_SOCKET_TIMEOUT_S
    try:
        # A wrong URL fails now, with one PING and no retries, not after the whole retry window.
        with redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=3.0) as probe:
            probe.ping()
    except ValueError as exc:
        raise RedisUnreachable(f"bad Redis URL {redact(url)!r}: {exc}") from None
    except redis.AuthenticationError as exc:
        raise RedisUnreachable(f"Redis at {redact(url)} refused the credentials: {exc}") from None
    except redis.ResponseError as exc:  # e.g. an ACL user without the commands clusterenv uses
        raise RedisUnreachable(f"Redis at {redact(url)} refused PING: {exc}") from None
    except redis.RedisError as exc:
        raise RedisUnreachable(f"cannot reach Redis at {redact(url)}: {exc}") from None
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=3.0, health_check_interval=30,
        retry=Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )  # fmt: skip
