"""Bearer-key parsing and the master-key check used when no key store is configured."""

import hmac

from gateway.context import Handler, Principal, Reply, RequestContext
from gateway.errors import OpenAIError


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


class MasterKeyAuth:
    def __init__(self, master_key: str) -> None:
        self._master = master_key.encode()

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        if not hmac.compare_digest(bearer_key(ctx.headers).encode(), self._master):
            raise invalid_key()
        ctx.principal = Principal(tenant_id="master", key_id="master", key_prefix="master")
        return await call_next(ctx)
