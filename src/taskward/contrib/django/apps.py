"""The Django app of ``taskward.contrib.django`` (its management command)."""

from django.apps import AppConfig


class TaskwardConfig(AppConfig):  # type: ignore[misc]
    name = "taskward.contrib.django"
    label = "taskward"
    verbose_name = "taskward"
