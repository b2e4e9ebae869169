-- 0012_dependencies_results: why — DESIGN.md R21 (dependencies) and R22 (results) give
-- waiting_dependency its producer and a completed task its return value.
--
--   task_dependencies  R21: one row per (dependent, dependency), written in the dependent's
--                      admission transaction and never changed. No foreign keys: admission
--                      checks that every dependency exists under the lock it takes on it
--                      (dependencies.lock_dependencies), and the rows of one task move
--                      together (R23's archive moves a task with its links).
--   has_dependents     R21: set on a dependency by its dependent's admission (in that
--                      transaction, as the lock); a terminal write reads it back from its
--                      compare-and-swap, so only a task that has dependents pays for settling
--                      them (transitions.readiness), and a drain without dependencies pays one
--                      returned column.
--   task_results       R22: a completed attempt's JSON return value, written in the completing
--                      transition's transaction, one row per (task, attempt).
ALTER TABLE schedule_runs ADD COLUMN has_dependents INTEGER NOT NULL DEFAULT 0
  CHECK (has_dependents IN (0, 1));

CREATE TABLE task_dependencies (
  task_id       TEXT NOT NULL,
  depends_on_id TEXT NOT NULL,
  created_at    REAL NOT NULL,
  PRIMARY KEY (task_id, depends_on_id),
  CHECK (task_id <> depends_on_id)
) WITHOUT ROWID;
CREATE INDEX idx_task_dependencies_on ON task_dependencies(depends_on_id, task_id);

CREATE TABLE task_results (
  task_id      TEXT NOT NULL,
  attempt      INTEGER NOT NULL CHECK (attempt >= 1),
  result       TEXT NOT NULL CHECK (json_valid(result)),
  result_bytes INTEGER NOT NULL CHECK (result_bytes >= 0),
  created_at   REAL NOT NULL,
  PRIMARY KEY (task_id, attempt)
) WITHOUT ROWID;
