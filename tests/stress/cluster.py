"""A private PostgreSQL cluster for fault tests: its own data directory, port and postmaster.

Restarting it (``-m immediate``) or stopping it leaves the shared test server alone. Created with
``initdb`` and driven with ``pg_ctl`` from the server's binaries; as root (CI) they run as the
``postgres`` user through ``runuser``, since the postmaster refuses to run as root.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg

PG_USER = "postgres"


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: ``TASKWARD_TEST_PG_BINDIR``, else the
    newest ``/usr/lib/postgresql/<version>/bin`` (Debian), else ``initdb`` on PATH."""
    configured = os.environ.get("TASKWARD_TEST_PG_BINDIR")
    if configured:
        return Path(configured)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()],
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrivateCluster:
    """One postmaster on 127.0.0.1:<port>, trust auth, fsync off (crash recovery still works:
    only an operating-system crash would lose what fsync protects)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.as_root = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="tw_fault_"))
        self.data = self.root / "data"
        self.log = self.root / "postmaster.log"
        self.port = free_port()
        if self.as_root:
            entry = pwd.getpwnam(PG_USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)

    # -- running the server's tools --------------------------------------------------------

    def _run(self, tool: str, *args: str, timeout: float = 60) -> str:
        argv = [str(self.bindir / tool), *args]
        if self.as_root:
            argv = ["runuser", "-u", PG_USER, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}"
                f"{done.stdout.strip()}\n{tail}"
            )
        return done.stdout

    def _options(self) -> str:
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c max_connections=200"
        )

    def init(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "--auth=trust",
            "-U",
            PG_USER,
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )

    def start(self) -> None:
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self._options(), "-w",
            "-t", "60", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "immediate") -> None:
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self._options(), "-m",
            mode, "-w", "-t", "60", "restart",
        )  # fmt: skip

    def is_running(self) -> bool:
        try:
            self._run("pg_ctl", "-D", str(self.data), "status", timeout=10)
        except RuntimeError:
            return False
        return True

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self.is_running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- stores ----------------------------------------------------------------------------

    def url(self, schema: str | None = None, **params: str | float) -> str:
        """A URL of the cluster's ``postgres`` database, in ``schema`` when given."""
        if schema is not None:
            params["options"] = quote(f"-csearch_path={schema}")
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres" + (
            f"?{query}" if query else ""
        )

    def create_schema(self) -> str:
        """A fresh schema (a store of its own: creating a database would take a second)."""
        name = f"tw_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return name

    def terminate_backends(self) -> int:
        """``pg_terminate_backend`` every other session; returns how many."""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        return int(row[0]) if row else 0

    def sessions(self, application_name: str) -> int:
        """Sessions named ``application_name`` (0 while the server is away)."""
        try:
            with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = %s",
                    (application_name,),
                ).fetchone()
        except psycopg.OperationalError:
            return 0
        return int(row[0]) if row else 0


def create_cluster() -> PrivateCluster:
    """Create and start a private cluster, or raise RuntimeError saying why it cannot be."""
    bindir = find_bindir()
    if bindir is None or not (bindir / "initdb").exists():
        raise RuntimeError(
            "no PostgreSQL server binaries (initdb, pg_ctl) found; set TASKWARD_TEST_PG_BINDIR"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_USER)
        except KeyError as exc:
            raise RuntimeError(f"running as root and there is no {PG_USER!r} user") from exc
        if shutil.which("runuser") is None:
            raise RuntimeError("running as root and runuser is missing")
    cluster = PrivateCluster(bindir)
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        cluster.destroy()
        raise
    return cluster
