"""Opens the rate limiter's Redis connection from the URL and options (policies/redis_connect.py for the
URL forms): one Redis, the master named by Sentinels, or a Redis Cluster; TLS and ACL users on each.

`check_access` runs at start: credentials or ACL permissions Redis refuses, a certificate that does not
verify or a cluster setting that does not match the server are errors (RedisRefused) the gateway does not
start with; a Redis that is merely down is logged, and the failover limiter answers until it returns.
"""

import logging
import ssl
from collections.abc import Awaitable, Callable

from redis.exceptions import (
    AskError,
    AuthenticationError,
    ConnectionError,
    MovedError,
    NoPermissionError,
    RedisError,
    ResponseError,
)

from policies.config import RedisOptions
from policies.ratelimit.cluster import ClusterPool
from policies.ratelimit.resp import Pool, Resolver, RespPool
from policies.redis_connect import RedisTarget, parse_redis_url, tls_context

log = logging.getLogger(__name__)
Probe = Callable[[], Awaitable[object]]


class RedisRefused(RuntimeError):
    """The limiter's Redis refuses this gateway (credentials, ACL, TLS, cluster mode): said in one line."""


def open_pool(url: str, options: RedisOptions, timeout_s: float) -> Pool:
    target = parse_redis_url(url)
    tls = tls_context(options) if target.tls else None

    def node(host: str, port: int, db: int = target.db, resolve: Resolver | None = None) -> RespPool:
        return RespPool(host, port, db=db, password=target.password, username=target.username,
                        timeout_s=timeout_s, tls=tls, server_hostname=options.tls_server_name,
                        resolve=resolve, role_check=resolve is not None)  # fmt: skip

    if options.cluster:
        if target.db:
            raise ValueError("a Redis Cluster has database 0 only: leave the db out of the Redis URL")
        return ClusterPool(list(target.hosts), lambda host, port: node(host, port, 0))
    if options.sentinel_master is not None:
        resolve = sentinel_resolver(target, options, options.sentinel_master, tls, timeout_s)
        return node(*target.hosts[0], resolve=resolve)
    return node(*target.hosts[0])


def sentinel_resolver(
    target: RedisTarget, options: RedisOptions, master: str, tls: ssl.SSLContext | None, timeout_s: float
) -> Resolver:
    """The master's address, asked of each Sentinel in turn for every new connection (after a failover,
    the new master's)."""
    secret = options.sentinel_password.get_secret_value() if options.sentinel_password else None

    async def resolve() -> tuple[str, int]:
        problems = []
        for host, port in target.hosts:
            sentinel = RespPool(host, port, username=options.sentinel_username, password=secret,
                                timeout_s=timeout_s, tls=tls, server_hostname=options.tls_server_name)  # fmt: skip
            try:
                reply = await sentinel.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", master)
            except (AuthenticationError, NoPermissionError):
                raise
            except (RedisError, OSError) as exc:
                problems.append(f"{host}:{port}: {type(exc).__name__}")
                continue
            finally:
                sentinel.close()
            if reply:
                return reply[0].decode(), int(reply[1])
            problems.append(f"{host}:{port}: no master named {master!r}")
        raise ConnectionError("no Sentinel named the master (" + "; ".join(problems) + ")")

    return resolve


async def check_access(pool: Pool, probe: Probe) -> None:
    """Connects and runs one harmless script call on the limiter's keys (AUTH, ACL key and command rights)."""
    try:
        await pool.connect()
        await probe()
        if not isinstance(pool, ClusterPool) and await _is_cluster_node(pool):
            raise RedisRefused(f"the rate limiter's Redis at {pool.where} is a Redis Cluster node; set "
                               "LLMGW_POLICIES__REDIS__CLUSTER=true")  # fmt: skip
    except (RedisError, OSError) as exc:
        if _refused(exc):
            raise RedisRefused(_refusal(pool, exc)) from exc
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLError):  # a certificate that does not verify will not start to
            raise RedisRefused(f"the rate limiter's Redis at {pool.where}: TLS failed ({cause})") from exc
        if isinstance(cause, ConnectionResetError) and getattr(pool, "uses_tls", False):
            # TLS 1.3: the server checks the client's certificate after the client's handshake has ended, so a
            # refused (or missing) client certificate shows as a reset on the first command, not an SSLError
            raise RedisRefused(f"the rate limiter's Redis at {pool.where}: TLS failed (the server reset the "
                               "connection after the handshake: a client certificate it does not accept?)") from exc  # fmt: skip
        log.warning("rate limiting: Redis at %s is unavailable at start (%s); the failover limiter answers "
                    "until it is back", pool.where, exc)  # fmt: skip


async def _is_cluster_node(pool: Pool) -> bool:
    """Whether CLUSTER INFO answers (any error, NOPERM included, says nothing: not a cluster, as far as known)."""
    try:
        await pool.call("CLUSTER", "INFO")
    except (RedisError, OSError):
        return False
    return True


def _refused(exc: BaseException) -> bool:
    """Errors that waiting will not mend: credentials, ACL rights, or a cluster setting that does not match."""
    if isinstance(exc, AuthenticationError | NoPermissionError | MovedError | AskError):
        return True
    return isinstance(exc, ResponseError) and "cluster support disabled" in str(exc)


def _refusal(pool: Pool, exc: BaseException) -> str:
    if isinstance(exc, AuthenticationError):
        hint = "check the user and password in LLMGW_REDIS_URL (redis://user:password@host)"
    elif isinstance(exc, NoPermissionError):
        hint = (
            "the ACL user needs the limiter's commands (+@scripting and those its scripts run) and ~<prefix>*"
        )
    else:
        hint = "for a Redis Cluster set LLMGW_POLICIES__REDIS__CLUSTER=true, for one Redis leave it unset"
    return (
        f"the rate limiter's Redis at {pool.where} refused this gateway ({type(exc).__name__}: {exc}); {hint}"
    )
