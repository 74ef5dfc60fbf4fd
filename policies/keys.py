"""Virtual API keys and admin tokens: random secrets, stored only as a sha256 hash plus a short visible prefix."""

import hashlib
import secrets
from dataclasses import dataclass

KEY_PREFIX = "sk-gw-"
ADMIN_TOKEN_PREFIX = "llmgw-adm-"  # admin tokens made through the admin API (policies/admin/tokens.py)
VISIBLE_CHARS = 12


@dataclass(frozen=True)
class NewKey:
    secret: str  # shown once, never stored
    key_hash: str
    prefix: str


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_key(kind: str = KEY_PREFIX) -> NewKey:
    secret = kind + secrets.token_urlsafe(32)
    return NewKey(
        secret=secret, key_hash=hash_key(secret), prefix=secret[: len(kind) + VISIBLE_CHARS - len(KEY_PREFIX)]
    )


def new_id(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(8)}"
