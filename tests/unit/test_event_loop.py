"""The long-running CLI processes run on uvloop where it is installed (cli.common.new_event_loop);
TASKWARD_EVENT_LOOP chooses auto, uvloop or asyncio."""

from __future__ import annotations

import asyncio

import click
import pytest

from taskward.cli.common import EVENT_LOOP_ENV, new_event_loop

uvloop = pytest.importorskip("uvloop")


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, uvloop.Loop),
        ("", uvloop.Loop),
        ("auto", uvloop.Loop),
        ("UVLOOP", uvloop.Loop),
        ("asyncio", asyncio.BaseEventLoop),
    ],
)
def test_the_loop_is_the_one_chosen(
    monkeypatch: pytest.MonkeyPatch, choice: str | None, expected: type
) -> None:
    if choice is None:
        monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    else:
        monkeypatch.setenv(EVENT_LOOP_ENV, choice)
    loop = new_event_loop()
    try:
        assert isinstance(loop, expected)
        assert isinstance(loop, uvloop.Loop) == (expected is uvloop.Loop)
        assert loop.run_until_complete(asyncio.sleep(0, "ran")) == "ran"
    finally:
        loop.close()


def test_an_unknown_loop_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    with pytest.raises(click.UsageError, match="auto, uvloop, asyncio"):
        new_event_loop()
