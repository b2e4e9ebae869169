-- 0013_retention: why — issue 28 and DESIGN.md R23.
--
--   workers.stopped_at  set when a worker stops cleanly (runtime.WorkerRuntime, the last thing
--                       it writes); a later heartbeat of the same id clears it. A worker is
--                       then "stopped" (not "stale": a stale heartbeat without a stop is a
--                       worker that probably crashed), and prunable (heartbeat.prune_workers).
ALTER TABLE workers ADD COLUMN stopped_at DOUBLE PRECISION;

-- R23's archive (``taskward archive``, archive.py). Archive storage is in the same database:
-- a task moves in one transaction with nothing half-written (the run, its facts, events,
-- summaries, results, dependency links and finished notifications leave the live tables as its
-- document arrives), no second store to configure, back up or reach, and the live tables -- what
-- claims, counts and listings scan -- shrink. An operator who wants the archive elsewhere exports
-- archived_runs (one self-contained JSON document per task) and deletes the rows.
--
--   archived_runs        one row per archived task: a few columns to find it by, and the
--                        document {"run", "facts", "events", "summaries", "results",
--                        "dependencies", "notifications"} (every row as it was, facts and
--                        events in insertion order). reads.get_task and list_transitions read
--                        it when the live row is gone.
--   task_key_tombstones  what admission promises about an archived task's key, kept live
--                        forever (R23): the same key with the same application returns
--                        task_id, a different one is a conflict. Admission's insert refuses a
--                        key found here and run_get_by_key answers from here: the one
--                        admission path, no second one.
CREATE TABLE archived_runs (
  id           TEXT PRIMARY KEY,
  status       TEXT NOT NULL,
  action_kind  TEXT NOT NULL,
  created_at   DOUBLE PRECISION NOT NULL,
  ended_at     DOUBLE PRECISION,
  archived_at  DOUBLE PRECISION NOT NULL,
  document     JSONB NOT NULL
);
CREATE INDEX idx_archived_runs_archived ON archived_runs(archived_at);

CREATE TABLE task_key_tombstones (
  idempotency_key  TEXT PRIMARY KEY,
  application_hash TEXT NOT NULL,
  task_id          TEXT NOT NULL,
  run_after        DOUBLE PRECISION,
  archived_at      DOUBLE PRECISION NOT NULL
);

-- Facts stay append-only (ADR-0072 D3) with one exception: the facts of a task whose document
-- is already in archived_runs, deleted by the archive's own transaction as they move. UPDATE
-- and TRUNCATE are refused as before.
CREATE OR REPLACE FUNCTION taskward_refuse_fact_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW' THEN
    IF EXISTS (SELECT 1 FROM archived_runs WHERE id = OLD.entity_id) THEN
      RETURN OLD;
    END IF;
  END IF;
  RAISE EXCEPTION 'status_transitions is append-only';
END
$$;
