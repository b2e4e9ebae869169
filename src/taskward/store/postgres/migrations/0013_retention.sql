-- 0013_retention: why — issue 28 and DESIGN.md R23.
--
--   workers.stopped_at  set when a worker stops cleanly (runtime.WorkerRuntime, the last thing
--                       it writes); a later heartbeat of the same id clears it. A worker is
--                       then "stopped" (not "stale": a stale heartbeat without a stop is a
--                       worker that probably crashed), and prunable (heartbeat.prune_workers).
ALTER TABLE workers ADD COLUMN stopped_at DOUBLE PRECISION;
