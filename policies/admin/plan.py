"""POST /admin/v1/plan: `llmgw plan`'s capacity arithmetic behind the admin API (routing/planning).

The body is a routing.planning.request.PlanRequest (a HF config.json's content or a shape, a GPU, a
workload as rate and lengths, the SLO); the answer is the JSON `llmgw plan` prints. Trace files and
calibration files stay with the CLI: the route reads nothing from the server's disk.
"""

from typing import Any

from fastapi import APIRouter

from core.errors import bad_request
from routing.planning.request import PlanRequest, answer


def plan_routes(router: APIRouter) -> None:
    @router.post("/plan")
    async def capacity_plan(body: PlanRequest) -> dict[str, Any]:
        try:
            return answer(body)
        except ValueError as error:  # a config.json without the fields a shape needs
            raise bad_request(str(error), param="config") from None
