"""Settings and policy fields that were renamed: the field carries the new name, the old ones stay accepted
(in the YAML file, LLMGW_* variables, stored policies and admin API bodies) as deprecated aliases.

A renamed field takes `validation_alias=formerly(new, *old)`, in a model derived from AcceptsFormerNames:
where both names are given (an old name in the file, the new one in the environment; a gateway's engine
child inheriting the old variable beside the new one), the new name wins instead of the old being refused."""

from typing import Any

from pydantic import AliasChoices, BaseModel, model_validator
from pydantic.fields import FieldInfo


def formerly(name: str, *old_names: str) -> AliasChoices:
    """The validation_alias of field `name`: its own name first, then the deprecated names still read."""
    return AliasChoices(name, *old_names)


def old_names(field: FieldInfo) -> list[str]:
    """The deprecated names a field (given `formerly(...)`) still accepts; [] for a field never renamed."""
    alias = field.validation_alias
    if not isinstance(alias, AliasChoices):
        return []
    return [choice for choice in alias.choices[1:] if isinstance(choice, str)]


def accepted_names(model: type[BaseModel]) -> set[str]:
    """Every key `model` reads: its field names and their deprecated names."""
    return {key for name, field in model.model_fields.items() for key in (name, *old_names(field))}


class AcceptsFormerNames(BaseModel):
    """A model some of whose fields were renamed (see the module's docstring)."""

    @model_validator(mode="before")
    @classmethod
    def _new_name_wins(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        fields = cls.model_fields.items()
        shadowed = {old for name, field in fields if name in values for old in old_names(field)}
        return {key: value for key, value in values.items() if key not in shadowed}
