"""The one reader of service settings from the environment (``HEALTHPLANE_*``).

A service's tuning is a pydantic model whose fields name their variable (``alias``) and carry
their bounds; :meth:`EnvSettings.from_env` reads the variables that are set, leaves the
others at their defaults, and refuses a bad value with one line naming the variable, what
it must be, and what it got — never a bare ``could not convert string to float``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Self

import pydantic


class SettingsError(ValueError):
    """One line per variable that is wrong."""


class EnvSettings(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, populate_by_name=True, extra="forbid")
    PREFIX: ClassVar[str] = "HEALTHPLANE_"

    @classmethod
    def variable(cls, field: str) -> str:
        return cls.PREFIX + (cls.model_fields[field].alias or field.upper())

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        given = {name: environ[cls.variable(name)] for name in cls.model_fields
                 if environ.get(cls.variable(name), "").strip()}
        try:
            return cls.model_validate(given)
        except pydantic.ValidationError as exc:
            lines = []
            for error in exc.errors():
                name = str(error["loc"][0]) if error["loc"] else ""
                field = next((f for f, info in cls.model_fields.items() if name in (f, info.alias)), name)
                lines.append(f"{cls.variable(field)}: {error['msg'].lower()} (got {given.get(field)!r})")
            raise SettingsError("; ".join(lines)) from None
