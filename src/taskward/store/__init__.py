"""The store: the StateDB port and its SQLite and PostgreSQL dialects behind one URL."""

from taskward.store.open import open_db, resolve_url
from taskward.store.port import JSON_COLUMNS, StateDB, Tx

__all__ = ["JSON_COLUMNS", "StateDB", "Tx", "open_db", "resolve_url"]
