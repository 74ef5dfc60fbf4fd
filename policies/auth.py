"""The proxy path's first stages: who is calling (AuthStage) and what they may do (PolicyStage).

The HTTP layer asks AuthStage.principal_for before it reads a request's body, so a caller without a valid
key gets its 401 whatever the body holds; the stage itself then finds the caller known.

Both read only the in-memory Directory: no database query per request. A model outside the
policy's allowed list answers 404 model_not_found, as OpenAI does for models a key cannot see.
"""

import hmac

from core.context import Handler, Principal, Reply, RequestContext
from core.errors import OpenAIError, model_not_found
from policies.directory import Directory, KeyEntry
from policies.keys import hash_key
from policies.tables import utcnow

MASTER = Principal(tenant_id="master", key_id="master", key_prefix="master")


def bearer_key(headers: dict[str, str]) -> str:
    value = headers.get("authorization", "")
    scheme, _, key = value.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise OpenAIError(
            401,
            "You didn't provide an API key. Provide it in the Authorization header as 'Bearer YOUR_KEY'.",
            code="missing_api_key",
        )
    return key.strip()


def invalid_key() -> OpenAIError:
    return OpenAIError(401, "Incorrect API key provided.", code="invalid_api_key")


class AuthStage:
    def __init__(self, directory: Directory, master_key: str) -> None:
        self._directory = directory
        self._master = master_key.encode()

    def principal_for(self, headers: dict[str, str]) -> Principal:
        """The caller of a request with these headers, or a 401 (no key, an unknown or expired one)."""
        secret = bearer_key(headers)
        if hmac.compare_digest(secret.encode(), self._master):
            return MASTER
        return self._principal(self._directory.lookup(hash_key(secret)))

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        if ctx.principal is None:  # the HTTP layer authenticates before it reads a body (gateway/proxy.py)
            ctx.principal = self.principal_for(ctx.headers)
        return await call_next(ctx)

    @staticmethod
    def _principal(entry: KeyEntry | None) -> Principal:
        if entry is None or (entry.expires_at is not None and entry.expires_at <= utcnow()):
            raise invalid_key()
        return entry.principal


class PolicyStage:
    def __init__(self, directory: Directory) -> None:
        self._directory = directory

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        if ctx.principal is not None and ctx.principal is not MASTER:
            ctx.policy = self._directory.policy_for(ctx.principal.key_id)
        if ctx.policy is not None and not ctx.policy.allows(ctx.model):
            raise model_not_found(ctx.model)
        return await call_next(ctx)
