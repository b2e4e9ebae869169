"""``python manage.py taskward_worker [OPTIONS]``: ``taskward worker`` with the project's store
and imports (``TASKWARD`` in settings); every other option is the worker's own."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand

from taskward.cli.main import main
from taskward.contrib.django import database_url, settings


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run a taskward worker over the project's store (options: taskward worker --help)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("worker_args", nargs="*", help="taskward worker options")
        parser.add_argument(
            "--migrate-only", action="store_true", help="create or upgrade the store and exit"
        )

    def run_from_argv(self, argv: list[str]) -> None:
        # Every option after the command's name is the worker's (click parses them), except
        # --migrate-only; Django's parser would refuse the worker's own options.
        args = argv[2:]
        migrate_only = "--migrate-only" in args
        worker_args = [a for a in args if a != "--migrate-only"]
        sys.exit(self._run(worker_args, migrate_only))

    def handle(self, *args: Any, **options: Any) -> None:
        code = self._run(list(options.get("worker_args") or ()), options.get("migrate_only"))
        if code:
            raise SystemExit(code)

    def _run(self, worker_args: list[str], migrate_only: bool | None) -> int:
        argv = ["--db", database_url()]
        for module in settings().get("IMPORTS", ()):
            argv += ["--import", module]
        return main([*argv, "migrate"] if migrate_only else [*argv, "worker", *worker_args])
