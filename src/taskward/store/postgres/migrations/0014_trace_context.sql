-- 0014_trace_context: why — issue 28 (tracing): a task carries the W3C trace context of the
-- span that admitted it, so the worker that runs it (in any process) continues that trace.
--
--   trace_context  the admission span's W3C headers as JSON text ({"traceparent": ...,
--                  "tracestate": ...}, at most 1,024 characters: taskward/tracing.py), written
--                  by admission's insert only when a span was active, else NULL. Not part of
--                  the application (not hashed): a replayed key keeps the first context. Text,
--                  not JSON, so no reader decodes it: only a worker with a tracer provider
--                  parses it.
ALTER TABLE schedule_runs ADD COLUMN trace_context text;
