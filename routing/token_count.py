"""Counting a chat's prompt tokens where it would be served (Anthropic's POST /v1/messages/count_tokens).

Outside the request pipeline: nothing is generated, billed, cached or rate limited. The count comes from a
deployment of the alias asked for (a cascade's small model, which answers first), by that deployment's own
tokenizer and chat template, through vLLM's POST /tokenize (our engine serves the same), so it equals the
`prompt_tokens` a request with that chat would report. Deployments are tried in the alias's routing order;
one that cannot count (no /tokenize, unreachable) hands over to the next.
"""

from typing import Any

from backends.base import UpstreamError
from core.context import Policy
from core.errors import OpenAIError, model_not_found
from routing.cascade import CascadeStage
from routing.config import RoutingPolicy
from routing.policy import policy_section
from routing.router import Router

_COUNTED = (
    "messages",
    "tools",
    "tool_choice",
    "continue_final_message",
    "add_generation_prompt",
)  # the template's


class TokenCounter:
    def __init__(self, router: Router, cascades: CascadeStage) -> None:
        self._router = router
        self._cascades = cascades

    async def count(self, chat: dict[str, Any], policy: Policy | None, request_id: str) -> int:
        """The prompt tokens of `chat` (a chat-completions body) on a deployment of `chat["model"]`."""
        alias = chat["model"]
        cascade = self._cascades.cascade_named(alias, policy)
        target = cascade.small if cascade else alias
        replicas = [r for r in self._router.pools.get(target, []) if "chat" in r.backend.config.endpoints]
        if not replicas:
            raise model_not_found(alias)
        routing = policy_section(policy, "routing", RoutingPolicy)
        order, _ = self._router.plan(target, replicas, "chat", chat, routing)
        body = {key: chat[key] for key in _COUNTED if key in chat}
        errors: list[UpstreamError] = []
        for replica in order or replicas:
            try:
                return (await replica.backend.tokenize(body, request_id))["count"]
            except UpstreamError as error:
                if not error.retryable:
                    raise
                errors.append(error)
        unsupported = [e for e in errors if e.code == "count_tokens_unsupported"]
        if unsupported and len(unsupported) == len(errors):
            raise OpenAIError(400, f"No deployment of `{alias}` can count tokens (none serves /tokenize).",
                              param="model", code="count_tokens_unsupported")  # fmt: skip
        raise errors[-1] if errors else OpenAIError(503, f"No deployment of `{alias}` is available.")
