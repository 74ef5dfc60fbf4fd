"""Where and how this package reaches Redis: the URL's forms plus the typed options (policies/config.py
RedisOptions), for the rate limiter's own RESP client and for the change notifier's redis-py client.

    redis://[[user]:password@]host[:port][/db]          plain TCP; `user` is an ACL user (AUTH user password)
    rediss://...                                          TLS, verified against tls_ca_file or the system CAs
    redis://[...@]host1:port1,host2:port2[/db]            several hosts: Cluster seed nodes (cluster: true)
                                                          or Sentinels (sentinel_master: <name>)

Errors name hosts and ports only: a URL carries the password.
"""

import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from policies.config import RedisOptions

DEFAULT_PORT = 6379


@dataclass(frozen=True)
class RedisTarget:
    hosts: tuple[tuple[str, int], ...]  # the server, Cluster seeds or Sentinels
    username: str | None
    password: str | None = field(repr=False)
    db: int
    tls: bool

    @property
    def where(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.hosts)


def parse_redis_url(url: str) -> RedisTarget:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("redis", "rediss"):
        raise ValueError("the Redis URL must start with redis:// or rediss:// (TLS)")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts = tuple(_host_port(h) for h in (hostlist or "127.0.0.1").split(","))
    db_text = path.strip("/") or _query_value(query, "db") or "0"
    if not db_text.isdigit():
        raise ValueError("the Redis URL's database must be a number (redis://host:port/0)")
    return RedisTarget(hosts, username, password, int(db_text), scheme == "rediss")


def _host_port(text: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if port and not port.isdigit():
        raise ValueError("a Redis URL's port must be a number")
    return host or "127.0.0.1", int(port) if port else DEFAULT_PORT


def _query_value(query: str, name: str) -> str | None:
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if key == name:
            return value
    return None


def tls_context(options: RedisOptions) -> ssl.SSLContext:
    """Verification on unless tls_verify is false; a missing CA or certificate file fails here, at start."""
    context = ssl.create_default_context(cafile=options.tls_ca_file)
    if options.tls_cert_file is not None:
        context.load_cert_chain(options.tls_cert_file, options.tls_key_file)
    if not options.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def redis_py_client(url: str, options: RedisOptions, cluster_client: bool = False, **kwargs: Any) -> Redis:
    """A redis-py client to the same Redis: the master through the Sentinels, any Cluster node (the
    notifier: PUBLISH reaches every node of a cluster) or, with `cluster_client`, a RedisCluster client that
    follows the slots (single-key stores: the Responses store), or the server itself."""
    target = parse_redis_url(url)
    tls: dict[str, Any] = {}
    if target.tls:
        tls = {"ssl": True, "ssl_ca_certs": _text(options.tls_ca_file), "ssl_certfile": _text(options.tls_cert_file),
               "ssl_keyfile": _text(options.tls_key_file), "ssl_cert_reqs": "required" if options.tls_verify else "none",
               "ssl_check_hostname": options.tls_verify}  # fmt: skip
    auth = {"username": target.username, "password": target.password}
    if options.sentinel_master is not None:
        secret = options.sentinel_password
        sentinels = Sentinel(list(target.hosts), sentinel_kwargs={
            "username": options.sentinel_username, "password": secret.get_secret_value() if secret else None, **tls,
        })  # fmt: skip
        return sentinels.master_for(options.sentinel_master, db=target.db, **auth, **tls, **kwargs)
    host, port = target.hosts[0]
    if options.cluster and cluster_client:
        return RedisCluster(host=host, port=port, **auth, **tls, **kwargs)  # type: ignore[return-value]
    db = 0 if options.cluster else target.db
    return Redis(host=host, port=port, db=db, **auth, **tls, **kwargs)


def _text(path: object) -> str | None:
    return None if path is None else str(path)
