-- 0010_revoked_sessions: why — a dashboard session is a signed cookie that no process keeps, so
-- logging out only cleared the browser's copy: a saved cookie went on working until it expired
-- (12 h). Logout now records the session's id here and every request with a session looks it
-- up, so the copy is refused by every service process on this store and after a restart
-- (dashboard/session.py). A row lives until its session would have expired anyway; each
-- logout deletes the expired ones, so the table holds at most one session lifetime of logouts.
CREATE TABLE revoked_sessions (
  session_id TEXT PRIMARY KEY,
  expires_at DOUBLE PRECISION NOT NULL
);

CREATE INDEX idx_revoked_sessions_expiry ON revoked_sessions(expires_at);
