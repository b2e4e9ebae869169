"""What the HTTP API (``taskward.api``) and the dashboard (``taskward.dashboard``) share, below
both: bearer-token access (``auth``) and its failure limit (``throttle``), the service's
configuration (``config``), the per-app state (``state``, which also holds the process's
``taskward.metrics.TaskMetrics``) and the problem documents (``problems``). Neither binding
imports the other; the app that mounts
both is ``taskward.http.create_app`` (docs/architecture.md "Layers")."""
