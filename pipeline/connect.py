"""Redis connections with timeouts that suit each use, and one clear error when a URL is unreachable."""

from __future__ import annotations

import redis

# redis-py 8 sets a 5 s socket timeout by default; blocking reads need more than their block.
BLOCKING_SOCKET_TIMEOUT_S = 30.0
COMMAND_SOCKET_TIMEOUT_S = 10.0


class RedisUnreachable(RuntimeError):
    """The Redis URL does not answer."""


def connect(url: str, *, blocking: bool = False) -> redis.Redis:
    """A client for `url`, checked with PING; `blocking=True` for XREADGROUP BLOCK / BLPOP users."""
    timeout = BLOCKING_SOCKET_TIMEOUT_S if blocking else COMMAND_SOCKET_TIMEOUT_S
    try:
        client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=3.0, health_check_interval=30
        )
        client.ping()
    except ValueError as exc:
        raise RedisUnreachable(f"bad Redis URL {url!r}: {exc}") from None
    except redis.RedisError as exc:
        raise RedisUnreachable(f"cannot reach Redis at {url}: {exc}") from None
    return client
