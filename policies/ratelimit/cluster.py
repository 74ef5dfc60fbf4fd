"""Redis Cluster for the rate limiter's RESP client: one pipelined connection (resp.RespPool) per master,
each command sent to the master of its first key's hash slot.

Every key of one script call shares a hash tag (`{tenant}`, redis_limiter._key), so an admission, its
settlement, a renewal and a replay each go to one node in one call, atomically, as on a single Redis; and
calls for one tenant keep their order, on that node's connection. The slot map comes from CLUSTER SLOTS
(any seed node) at start and again whenever a node answers MOVED (resharding, failover): the command is
sent again to the node named, and ASK is followed with ASKING for that one command.
"""

import asyncio
import binascii
from collections.abc import Callable
from typing import Any

from redis.exceptions import AskError, ConnectionError, MovedError, RedisError

from policies.ratelimit.resp import RespPool, _retrieve

SLOTS = 16384
SLOT_CACHE = 10_000
Address = tuple[str, int]
NodeFactory = Callable[[str, int], RespPool]  # a connection to one node (TLS and credentials included)
_KEYED_AT = {b"EVALSHA": 3, b"EVAL": 3, "EVALSHA": 3, "EVAL": 3}


class ClusterPool:
    def __init__(self, seeds: list[Address], node: NodeFactory) -> None:
        self._seeds = seeds
        self._node = node
        self._nodes: dict[Address, RespPool] = {}
        self._slots: list[Address] = []
        self._preloaded: list[str] = []
        self._slot_of: dict[str | bytes, int] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self.problem: BaseException | None = None

    @property
    def connected(self) -> bool:
        return bool(self._slots) and all(pool.connected for pool in self._masters())

    async def connect(self) -> None:
        """The slot map, then a connection to every master (raises why the first failure happened)."""
        await self._refresh()
        await asyncio.gather(*(pool.connect() for pool in self._masters()))

    async def call(self, *parts: str | bytes | int | float) -> Any:
        try:
            return await self.send(*parts)
        except (MovedError, AskError) as error:
            return await self.redirect(error, parts)

    def send(self, *parts: str | bytes | int | float, lazy: bool = False) -> "asyncio.Future[Any]":
        """To the master of the first key's slot; a MOVED or ASK reply is the caller's to pass to redirect
        (resp.LuaScript does), so the hot path adds no future of its own."""
        key = _key_of(parts)
        slot = self._slot(key) if key is not None else 0
        if not self._slots:
            return asyncio.ensure_future(self._send_after_refresh(slot, parts))
        return self._nodes[self._slots[slot]].send(*parts, lazy=lazy)

    def redirect(self, error: RedisError, parts: tuple) -> "asyncio.Future[Any]":
        assert isinstance(error, MovedError | AskError)
        address = (error.host, int(error.port))
        if isinstance(error, MovedError):
            if self._slots:
                self._slots[error.slot_id] = address
            self._refresh_soon()
        pool = self._pool(address)
        if isinstance(error, AskError):
            pool.send("ASKING").add_done_callback(_retrieve)
        return pool.send(*parts)

    async def _send_after_refresh(self, slot: int, parts: tuple) -> Any:
        await self._refresh()
        return await self._nodes[self._slots[slot]].send(*parts)

    def _slot(self, key: str | bytes) -> int:
        """By the key itself: the limiter names each bucket's keys once, so hits hash a cached str."""
        slot = self._slot_of.get(key)
        if slot is None:
            if len(self._slot_of) >= SLOT_CACHE:
                self._slot_of.clear()
            slot = self._slot_of[key] = key_slot(key.decode() if isinstance(key, bytes) else key)
        return slot

    def _refresh_soon(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
            self._refreshing.add_done_callback(_retrieve)

    async def _refresh(self) -> None:
        """The slot map from the first node that answers: known nodes first, then the seeds."""
        last: BaseException | None = None
        for address in [*self._nodes, *(s for s in self._seeds if s not in self._nodes)]:
            try:
                reply = await self._pool(address).call("CLUSTER", "SLOTS")
            except (RedisError, OSError) as exc:
                last = exc
                continue
            slots: list[Address] = [("", 0)] * SLOTS
            for start, end, master, *_ in reply:
                host = master[0].decode() if isinstance(master[0], bytes) else master[0]
                node = (host or address[0], int(master[1]))
                self._pool(node)
                slots[int(start) : int(end) + 1] = [node] * (int(end) - int(start) + 1)
            if any(port == 0 for _, port in slots):
                last = ConnectionError("the Redis Cluster does not cover every hash slot")
                continue
            self._slots, self.problem = slots, None
            return
        self.problem = last
        raise last if last is not None else ConnectionError("no Redis Cluster node to ask")

    def _pool(self, address: Address) -> RespPool:
        pool = self._nodes.get(address)
        if pool is None:
            pool = self._nodes[address] = self._node(*address)
            pool.lost_hook = self._refresh_soon  # a node gone: a failover may have moved its slots
            for source in self._preloaded:
                pool.preload(source)
        return pool

    def _masters(self) -> list[RespPool]:
        return [self._nodes[a] for a in dict.fromkeys(self._slots)]

    def preload(self, source: str) -> None:
        self._preloaded.append(source)
        for pool in self._nodes.values():
            pool.preload(source)

    @property
    def where(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self._nodes or self._seeds)

    def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
        for pool in self._nodes.values():
            pool.close()


def _key_of(parts: tuple) -> str | bytes | None:
    at = _KEYED_AT.get(parts[0], 1)
    if at == 3 and int(parts[2]) == 0:
        return None
    return parts[at] if len(parts) > at else None


def _hash_tag(key: str) -> str:
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def key_slot(key: str) -> int:
    """The Cluster hash slot of a key (CRC16/XMODEM of its hash tag, mod 16384)."""
    return _crc16(_hash_tag(key).encode()) % SLOTS


def _crc16(data: bytes) -> int:
    return binascii.crc_hqx(data, 0)  # CRC16/XMODEM, as Redis Cluster specifies
