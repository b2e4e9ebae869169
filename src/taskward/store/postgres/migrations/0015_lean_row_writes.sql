-- 0015_lean_row_writes: why — issue 27 (CPU per task). SQLite's 0015 rewrites the lists in
-- the CHECKs of task_events.kind and dispatch_outbox.status and in the WHERE of two partial
-- indexes, so that a row's insert builds no temporary b-tree of the list. PostgreSQL evaluates
-- `x IN (...)` of constants in place and keeps its constraints and indexes as they are; the
-- migration exists so that both dialects carry the same numbered history.
SELECT 1;
