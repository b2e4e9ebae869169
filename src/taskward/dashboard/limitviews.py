"""View models of the dashboard's limits page (DESIGN.md R20): every limit with what counts
against it, every kind with its pause, and the set form's values. Regions as ``views`` draws
them, from ``taskward.limits.list_limits`` rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from taskward.dashboard.views import Cell, Region, action_cell, cell, fmt_time, limit_href, table

LIMIT_COLUMNS = (
    "key",
    "max running",
    "running",
    "rate",
    "in window",
    "free",
    "state",
    "set",
    "",
)
KIND_COLUMNS = ("kind", "limit key", "state", "")
KIND_PREFIX: Final = "kind:"


def limit_state_text(limit: Mapping[str, Any]) -> str:
    """``paused``, ``full`` or ``3 free``: what the key admits now (as ``taskward limit list``)."""
    if limit["paused"]:
        return "paused"
    return "full" if limit["free"] <= 0 else f"{limit['free']} free"


def _limit_state_cls(limit: Mapping[str, Any]) -> str:
    if limit["paused"]:
        return "limit-paused"
    return "limit-full" if limit["free"] <= 0 else "limit-free"


def _set_by(limit: Mapping[str, Any]) -> str:
    by = limit.get("updated_by")
    return fmt_time(limit.get("updated_at")) + (f" by {by}" if by else "")


def _rate_text(limit: Mapping[str, Any]) -> str | None:
    if limit.get("rate") is None:
        return None
    return f"{limit['rate']} per {fmt_period(float(limit['period_s']))}"


def fmt_period(seconds: float) -> str:
    """A rate's period as an operator would write it: ``60s`` is ``1m``, ``3600s`` is ``1h``."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _limit_actions(limit: Mapping[str, Any], can_operate: bool) -> Cell:
    if not can_operate:
        return action_cell([])
    key = str(limit["limit_key"])
    actions: list[tuple[str, str, Mapping[str, str]]] = []
    if key.startswith(KIND_PREFIX):
        kind = key[len(KIND_PREFIX) :]
        if limit["paused"]:
            actions.append(("resume", "/limits/resume", {"kind": kind}))
        else:
            actions.append(("pause", "/limits/pause", {"kind": kind}))
    actions.append(("clear", "/limits/clear", {"limit_key": key}))
    return action_cell(actions)


def limits_regions(
    limits: Sequence[Mapping[str, Any]],
    kinds: Iterable[str],
    *,
    can_operate: bool,
    chosen: str | None = None,
) -> dict[str, Region]:
    """Every limit with what counts against it now (``limits.list_limits``), and every kind
    with its pause state: the registry's kinds and any other a ``kind:`` limit names."""
    lines = []
    for limit in limits:
        key = str(limit["limit_key"])
        counts_running = limit.get("max_running") is not None
        lines.append(
            [
                cell(key, href=limit_href(key), cls="mono" + (" chosen" if key == chosen else "")),
                cell(limit.get("max_running")),
                cell(limit.get("running") if counts_running else None),
                cell(_rate_text(limit)),
                cell(limit.get("recent") if limit.get("rate") is not None else None),
                cell(limit.get("free")),
                cell(limit_state_text(limit), cls=_limit_state_cls(limit)),
                cell(_set_by(limit)),
                _limit_actions(limit, can_operate),
            ]
        )
    by_key = {str(limit["limit_key"]): limit for limit in limits}
    names = set(kinds) | {k[len(KIND_PREFIX) :] for k in by_key if k.startswith(KIND_PREFIX)}
    kind_lines = []
    for kind in sorted(names):
        key = KIND_PREFIX + kind
        found = by_key.get(key)
        paused = bool(found and found["paused"])
        if found is None:
            state = "not limited"
        else:
            state = "paused" if paused else f"limited ({limit_state_text(found)})"
        action = ("resume", "/limits/resume") if paused else ("pause", "/limits/pause")
        kind_lines.append(
            [
                cell(kind, cls="mono"),
                cell(key, href=limit_href(key) if found else None, cls="mono"),
                cell(state, cls="limit-paused" if paused else None),
                action_cell([(*action, {"kind": kind})] if can_operate else []),
            ]
        )
    return {
        "limits": table(LIMIT_COLUMNS, lines, empty="no limits: every key runs freely"),
        "kinds": table(KIND_COLUMNS, kind_lines, empty="no kinds registered"),
    }


def limit_form_values(limits: Iterable[Mapping[str, Any]], chosen: str | None) -> dict[str, str]:
    """The set form's first values: the chosen key with its limit, if it has one."""
    values = {"limit_key": chosen or "", "max_running": "", "rate": "", "period_s": ""}
    for limit in limits:
        if limit["limit_key"] == chosen:
            if limit.get("max_running") is not None:
                values["max_running"] = str(limit["max_running"])
            if limit.get("rate") is not None:
                values["rate"] = str(limit["rate"])
                values["period_s"] = fmt_period(float(limit["period_s"]))
    return values
