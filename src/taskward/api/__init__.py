"""The JSON API under ``/api``: tasks and workers (``tasks``), schedules and the outbox
(``operations``), and their request and response bodies (``models``). Mounted, beside the
dashboard, by ``taskward.http.create_app``; it never imports the dashboard, nor the dashboard it
(docs/architecture.md "Layers")."""
