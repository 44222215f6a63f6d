"""One settings reader (issue 17): variables named in every refusal."""

from __future__ import annotations

import pydantic
import pytest

from healthplane.runtime.settings import EnvSettings, SettingsError


class Tuning(EnvSettings):
    PREFIX = "HEALTHPLANE_TEST_"
    queue_size: int = pydantic.Field(1024, ge=1)
    timeout_s: float = pydantic.Field(10.0, gt=0, alias="TIMEOUT_SECONDS")


def test_defaults_and_variables() -> None:
    assert Tuning.from_env({}) == Tuning()
    read = Tuning.from_env({"HEALTHPLANE_TEST_QUEUE_SIZE": "8", "HEALTHPLANE_TEST_TIMEOUT_SECONDS": "2.5",
                            "HEALTHPLANE_TEST_TIMEOUT_S": "ignored", "HEALTHPLANE_TEST_QUEUE_SIZE_X": "1"})
    assert (read.queue_size, read.timeout_s) == (8, 2.5)
    assert Tuning(timeout_s=3).timeout_s == 3  # by field name too


@pytest.mark.parametrize(("environ", "message"), [
    ({"HEALTHPLANE_TEST_QUEUE_SIZE": "lots"}, "HEALTHPLANE_TEST_QUEUE_SIZE: input should be a valid integer"),
    ({"HEALTHPLANE_TEST_QUEUE_SIZE": "0"}, "HEALTHPLANE_TEST_QUEUE_SIZE: input should be greater than or equal to 1 (got '0')"),
    ({"HEALTHPLANE_TEST_TIMEOUT_SECONDS": "soon"}, "HEALTHPLANE_TEST_TIMEOUT_SECONDS: input should be a valid number"),
])
def test_a_bad_value_names_its_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as refused:
        Tuning.from_env(environ)
    assert message in str(refused.value)
