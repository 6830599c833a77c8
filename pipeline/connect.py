"""Redis connections with timeouts that suit each use, retries that ride out a broker restart, and
one clear error when a URL is unreachable."""

from __future__ import annotations

import redis
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
    """The Redis URL does not answer."""


def connect(url: str, *, blocking: bool = False, retries: int = RETRIES) -> redis.Redis:
    """A client for `url`, checked with PING; `blocking=True` for XREADGROUP BLOCK / BLPOP users."""
    timeout = BLOCKING_SOCKET_TIMEOUT_S if blocking else COMMAND_SOCKET_TIMEOUT_S
    try:
        # A wrong URL fails now, with one PING and no retries, not after the whole retry window.
        with redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=3.0) as probe:
            probe.ping()
    except ValueError as exc:
        raise RedisUnreachable(f"bad Redis URL {url!r}: {exc}") from None
    except redis.RedisError as exc:
        raise RedisUnreachable(f"cannot reach Redis at {url}: {exc}") from None
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=3.0, health_check_interval=30,
        retry=Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )  # fmt: skip
