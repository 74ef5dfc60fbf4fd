"""A gateway replica for the two-process fleet tests: the real policies stages and admin API in
front of an in-process answerer (usage = the admission estimate), served by uvicorn.

Run: uvicorn tests.policies_replica:create_app --factory (configured by LLMGW_* variables).
Used until the lead's gateway.app wires the policies package; then the fleet tests also run there.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from core.context import Handler, Reply, RequestContext, Usage
from core.errors import OpenAIError
from gateway.pipeline import chain
from gateway.settings import load_settings
from policies.ratelimit import estimate
from policies.service import create_policy_services


async def answer(ctx: RequestContext, call_next: Handler) -> Reply:
    prompt = estimate.prompt_tokens(ctx.endpoint, ctx.body)
    completion = estimate.completion_tokens(ctx.endpoint, ctx.body, 16)
    ctx.usage, ctx.deployment, ctx.cost_usd = Usage(prompt, completion), "replica", 0.0
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return Reply(body={"object": "chat.completion", "model": ctx.model, "choices": [], "usage": usage})


def create_app() -> FastAPI:
    settings = load_settings()
    state: dict[str, Handler] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = await create_policy_services(settings.policies, settings.connections(), settings.models)
        app.include_router(services.admin_router)
        state["handler"] = chain([*services.stages, answer])
        yield
        await services.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        headers = dict(request.headers)
        ctx = RequestContext(request_id="r", endpoint="chat", body=body, headers=headers, model=body["model"])
        try:
            reply = await state["handler"](ctx)
        except OpenAIError as error:
            return Response(error.to_json(), error.status, error.headers, media_type="application/json")
        return Response(orjson.dumps(reply.body), reply.status, reply.headers, media_type="application/json")

    return app


def create_gateway_app() -> FastAPI:
    """The lead's full gateway, configured by LLMGW_* variables."""
    from gateway.app import create_app as create_gateway

    return create_gateway(load_settings())
