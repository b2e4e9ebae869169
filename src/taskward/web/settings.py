"""The HTTP service's ``TASKWARD_*`` environment variables: one pydantic-settings model.

Owns the variables' names (prefix + field name), types, defaults and bounds; ``read_settings``
turns an invalid value into a TaskValidationError naming the variable and what it allows.
Secrets are ``SecretStr`` (never in a repr or an error). It knows nothing of the token line
format (``config.parse_tokens``) nor of ``HttpConfig``, which ``HttpConfig.from_env`` builds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_core import PydanticUseDefault
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from taskward.errors import TaskValidationError
from taskward.web.throttle import FailureLimits

ENV_PREFIX: Final = "TASKWARD_"
DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024
_LIMITS: Final = FailureLimits()
_FINITE: Final = "a finite number >= 1"


class HttpSettings(BaseSettings):
    """``TASKWARD_<FIELD>``; blank is unset. ``auth_max_block_s >= auth_block_s`` is
    ``HttpConfig``'s check (it holds however the config is made)."""

    # validate_default off: the defaults are constants, and a blank value falls back to them.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, validate_default=False
    )

    api_tokens: SecretStr = Field(SecretStr(""), description="name:token:scope+scope,...")
    api_tokens_file: str = ""
    session_secret: SecretStr | None = None
    http_max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1, description="an integer >= 1")
    auth_max_failures: int = Field(_LIMITS.max_failures, ge=1, description="an integer >= 1")
    auth_failure_window_s: float = Field(
        _LIMITS.window_s, ge=1, allow_inf_nan=False, description=_FINITE
    )
    auth_block_s: float = Field(_LIMITS.block_s, ge=1, allow_inf_nan=False, description=_FINITE)
    auth_max_block_s: float = Field(
        _LIMITS.max_block_s, ge=1, allow_inf_nan=False, description=_FINITE
    )
    # Comma-separated addresses, not JSON (NoDecode).
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise PydanticUseDefault
        return value

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # read_settings reads the environment it is given (_EnvironSource): no other source.
        return (init_settings,)


class _EnvironSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.env_vars = {name.lower(): value for name, value in environ.items()}


def read_settings(environ: Mapping[str, str] | None = None) -> HttpSettings:
    """The settings in ``environ`` (default ``os.environ``).

    Raises:
        TaskValidationError: a variable's value is invalid; ``field`` is the variable's name.
    """
    values = _EnvironSource(HttpSettings, os.environ if environ is None else environ)()
    try:
        return HttpSettings(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        info = HttpSettings.model_fields[name]
        secret = info.annotation in (SecretStr, SecretStr | None)
        raise TaskValidationError(
            ENV_PREFIX + name.upper(),
            "***" if secret else error["input"],
            info.description or error["msg"],
        ) from None
