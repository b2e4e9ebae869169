"""taskward in a Django project (issue 29): settings, a transactional submit through Django's
own connection (R24), and a management command for the worker.

Add ``"taskward.contrib.django"`` to ``INSTALLED_APPS`` and configure::

    TASKWARD = {
        "DATABASE_URL": "postgresql://app@db/app",   # the store: the same database as Django's
        "IMPORTS": ["shop.tasks"],                     # modules of @taskward.task functions
    }

Then, in a view, inside ``transaction.atomic()`` (the task commits with the view's writes, or
not at all; no ``transaction.on_commit`` needed)::

    from taskward.contrib.django import submit_task
    task_id = submit_task(TaskApplication(...))   # or send_receipt.submit_sync(connection, ...)

and run workers with ``python manage.py taskward_worker`` (any ``taskward worker`` option:
``--concurrency 8``, ``--burst``, ...). ``DATABASE_URL`` defaults to ``TASKWARD_DATABASE_URL``;
the store's tables are created by ``python manage.py taskward_worker --migrate-only`` or
``taskward migrate``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings as django_settings
from django.db import connections

from taskward.adapters import AdapterConfig, build_registry
from taskward.admission import submit_task_sync
from taskward.errors import TaskValidationError
from taskward.models import TaskApplication
from taskward.registry import TaskAdapterRegistry
from taskward.store.open import ENV_VAR, resolve_url

SETTING = "TASKWARD"
KEYS = frozenset({"DATABASE_URL", "IMPORTS"})


def settings() -> dict[str, Any]:
    """The project's ``TASKWARD`` setting, checked: a dict with only ``KEYS``.

    Raises:
        TaskValidationError: another shape, naming the setting and what is allowed.
    """
    found = getattr(django_settings, SETTING, {})
    if not isinstance(found, dict) or not set(found) <= KEYS:
        raise TaskValidationError(SETTING, found, f"a dict with the keys {sorted(KEYS)}")
    imports = found.get("IMPORTS", [])
    if not isinstance(imports, list | tuple) or not all(isinstance(m, str) for m in imports):
        raise TaskValidationError(f"{SETTING}['IMPORTS']", imports, "a list of module names")
    return dict(found)


def database_url() -> str:
    """The store's URL: ``TASKWARD["DATABASE_URL"]``, else ``TASKWARD_DATABASE_URL``."""
    return resolve_url(settings().get("DATABASE_URL"))


@cache
def registry() -> TaskAdapterRegistry:
    """The adapters of this project: the built-ins and ``TASKWARD["IMPORTS"]`` (built once)."""
    return build_registry(AdapterConfig.from_env(imports=tuple(settings().get("IMPORTS", ()))))


def submit_task(
    app: TaskApplication, *, using: str = "default", admission_source: str = "library"
) -> str:
    """``taskward.submit_task_sync`` on Django's connection ``using``: inside the current
    ``transaction.atomic()`` block the task commits with it, or not at all (R24).

    Raises:
        TaskValidationError: bad input, or the connection is not in a transaction.
        TaskIdempotencyConflict: the key already admitted another application.
    """
    return submit_task_sync(
        connections[using], app, registry=registry(), admission_source=admission_source
    )


__all__ = ["ENV_VAR", "database_url", "registry", "settings", "submit_task"]
