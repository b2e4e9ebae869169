-- 0002_task_summaries: why — ADR-0037 D4 needs a durable summary per run (session key = run id
-- = "<task-id>:<attempt>") written before the queue acknowledges completion; LocalSummaryStore
-- keeps it in this store (DESIGN.md "One system, not three").
CREATE TABLE task_summaries (
  session_key   TEXT PRIMARY KEY,
  task_id       TEXT,
  attempt       INTEGER,
  state         TEXT NOT NULL CHECK (state IN ('pending', 'complete')),
  summary       JSONB,
  summary_hash  TEXT,
  reason        TEXT,
  created_at    DOUBLE PRECISION NOT NULL,
  updated_at    DOUBLE PRECISION NOT NULL,
  CHECK (state = 'pending' OR (summary IS NOT NULL AND summary_hash IS NOT NULL))
);

CREATE INDEX idx_task_summaries_task ON task_summaries(task_id, attempt);
