"""The JSON API under ``/api``: tasks and workers (``tasks``), a task's dependencies
(``dependencies``, R21), schedules and the outbox (``operations``), limits (``limits``), and
their request and response bodies (``models``). Mounted, beside the dashboard, by
``taskward.http.create_app``; it never imports the dashboard, nor the dashboard it
(docs/architecture.md "Layers")."""
