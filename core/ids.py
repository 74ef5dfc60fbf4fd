"""Ids the gateway makes itself (request ids, response and message ids): unique across processes and replicas,
never taken from what a client sent, and cheap (a random per-process prefix and a counter, no syscall)."""

import itertools
import secrets

_PROCESS_PREFIX = secrets.token_hex(8)
_sequence = itertools.count()


def next_request_id() -> str:
    """32 hex characters."""
    return f"{_PROCESS_PREFIX}{next(_sequence):016x}"
