"""Reading this package's sections out of a tenant policy (core.context.Policy, or None)."""

import logging
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from core.context import Policy

log = logging.getLogger("llmgw.routing")
M = TypeVar("M", bound=BaseModel)


def policy_section(policy: Policy | None, name: str, model: type[M]) -> M | None:
    """policy.<name> as `model`; None when absent, empty or invalid (invalid is logged, defaults apply)."""
    value = getattr(policy, name, None) if policy is not None else None
    if isinstance(value, model):
        return value
    if not value:
        return None
    try:
        return model.model_validate(value)
    except ValidationError as error:
        log.warning("ignoring an invalid %s policy section: %s", name, error)
        return None
