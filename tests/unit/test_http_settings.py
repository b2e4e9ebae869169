"""``HttpConfig.from_env`` over the pydantic-settings model (``taskward.web.settings``): every
``TASKWARD_*`` variable, blank as unset, the bounds, errors naming the variable, and secrets
kept out of reprs and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskward.errors import TaskValidationError
from taskward.web.config import ApiToken, HttpConfig
from taskward.web.settings import DEFAULT_MAX_BODY_BYTES, read_settings
from taskward.web.throttle import FailureLimits

TOKEN = "0123456789abcdefgh"


def test_nothing_set_is_the_defaults() -> None:
    config = HttpConfig.from_env({})
    assert config.tokens == () and config.max_body_bytes == DEFAULT_MAX_BODY_BYTES
    assert config.auth_limits == FailureLimits() and config.trusted_proxies == ()
    assert len(config.session_secret) == 32
    assert HttpConfig.from_env({}).session_secret != config.session_secret  # random each time


def test_every_variable_is_read(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"# operators\nops:{TOKEN}X:* # all\n", "utf-8")
    config = HttpConfig.from_env(
        {
            "TASKWARD_API_TOKENS": f"ci:{TOKEN}:submit+read, ",
            "TASKWARD_API_TOKENS_FILE": f" {tokens_file} ",
            "TASKWARD_SESSION_SECRET": "session-secret-0c8e",
            "TASKWARD_HTTP_MAX_BODY_BYTES": " 2048 ",
            "TASKWARD_AUTH_MAX_FAILURES": "3",
            "TASKWARD_AUTH_FAILURE_WINDOW_S": "30",
            "TASKWARD_AUTH_BLOCK_S": "2.5",
            "TASKWARD_AUTH_MAX_BLOCK_S": "20",
            "TASKWARD_TRUSTED_PROXIES": "10.0.0.1, ::1,,",
            "UNRELATED": "x",
        }
    )
    assert config.tokens == (
        ApiToken("ci", TOKEN, frozenset({"submit", "read"})),
        ApiToken("ops", f"{TOKEN}X", frozenset({"submit", "read", "operate"})),
    )
    assert config.session_secret == b"session-secret-0c8e"
    assert config.max_body_bytes == 2048
    assert config.auth_limits == FailureLimits(
        max_failures=3, window_s=30.0, block_s=2.5, max_block_s=20.0
    )
    assert config.trusted_proxies == ("10.0.0.1", "::1")


def test_a_tokens_file_argument_wins_over_the_variable(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen"
    chosen.write_text(f"a:{TOKEN}:read\n", "utf-8")
    env = {"TASKWARD_API_TOKENS_FILE": str(tmp_path / "missing")}
    assert HttpConfig.from_env(env, tokens_file=str(chosen)).tokens[0].name == "a"
    with pytest.raises(TaskValidationError) as caught:
        HttpConfig.from_env(env)
    assert caught.value.field == "TASKWARD_API_TOKENS_FILE"


def test_blank_values_are_unset() -> None:
    blank = {
        name: "  "
        for name in (
            "TASKWARD_API_TOKENS",
            "TASKWARD_API_TOKENS_FILE",
            "TASKWARD_SESSION_SECRET",
            "TASKWARD_HTTP_MAX_BODY_BYTES",
            "TASKWARD_AUTH_MAX_FAILURES",
            "TASKWARD_AUTH_BLOCK_S",
            "TASKWARD_TRUSTED_PROXIES",
        )
    }
    config = HttpConfig.from_env(blank)
    assert config.tokens == () and config.max_body_bytes == DEFAULT_MAX_BODY_BYTES
    assert config.auth_limits == FailureLimits() and config.trusted_proxies == ()


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("TASKWARD_HTTP_MAX_BODY_BYTES", "0", "an integer >= 1"),
        ("TASKWARD_HTTP_MAX_BODY_BYTES", "1MB", "an integer >= 1"),
        ("TASKWARD_AUTH_MAX_FAILURES", "ten", "an integer >= 1"),
        ("TASKWARD_AUTH_FAILURE_WINDOW_S", "inf", "a finite number >= 1"),
        ("TASKWARD_AUTH_BLOCK_S", "nan", "a finite number >= 1"),
        ("TASKWARD_AUTH_BLOCK_S", "0.5", "a finite number >= 1"),
        ("TASKWARD_AUTH_MAX_BLOCK_S", "1", "a finite number >= 5"),  # below the first block
    ],
)
def test_an_invalid_value_names_its_variable_and_what_it_allows(
    name: str, value: str, allowed: str
) -> None:
    with pytest.raises(TaskValidationError) as caught:
        HttpConfig.from_env({name: value})
    assert caught.value.field == name and caught.value.allowed == allowed
    assert value in str(caught.value)


def test_secrets_stay_out_of_reprs_and_errors() -> None:
    env = {"TASKWARD_API_TOKENS": f"ci:{TOKEN}:read", "TASKWARD_SESSION_SECRET": "hush-0c8e"}
    for shown in (repr(HttpConfig.from_env(env)), repr(read_settings(env))):
        assert TOKEN not in shown and "hush-0c8e" not in shown
    with pytest.raises(TaskValidationError) as caught:
        HttpConfig.from_env({"TASKWARD_API_TOKENS": f"ci:{TOKEN}:admin"})
    assert TOKEN not in str(caught.value)
    with pytest.raises(TaskValidationError) as caught:
        HttpConfig.from_env({"TASKWARD_API_TOKENS": f"ci:{TOKEN}"})
    assert TOKEN not in str(caught.value) and caught.value.field == "TASKWARD_API_TOKENS"


def test_from_env_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_HTTP_MAX_BODY_BYTES", "4096")
    monkeypatch.delenv("TASKWARD_API_TOKENS", raising=False)
    monkeypatch.delenv("TASKWARD_API_TOKENS_FILE", raising=False)
    assert HttpConfig.from_env().max_body_bytes == 4096
