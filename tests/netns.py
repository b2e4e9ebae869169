"""Worker hosts of the test's own for real-process tests across machines (issue 27 item 5).

``hosts(n)`` makes n network namespaces, each joined to the test's namespace by a veth pair on a
/24 of its own in 10.231.0.0/16 (the test's end ``.1``, the host's ``.2``); ``private_postgres``
starts a PostgreSQL 15 server of the test's own that listens on the test's veth addresses only
(never the shared server at 127.0.0.1:5432), plus a Unix socket in its temporary directory: the
test process's own way in, which keeps working when a host's link is cut. Every name and subnet
is unique per run, and both context managers undo everything they made on the way out, even
after a failure. ``require_netns`` skips (fails under ``CI=true``) when the machine cannot do it.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.worker_procs import ROOT

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_USER = "postgres"
SUBNET_PREFIX = "10.231"  # private (RFC 1918), off the shared 127.0.0.1 and the host's network


def _run(*argv: str, user: str | None = None, cwd: Path | None = None) -> str:
    """Run ``argv`` (as ``user`` through runuser), raising with its stderr on failure."""
    full = ["runuser", "-u", user, "--", *argv] if user else list(argv)
    proc = subprocess.run(full, capture_output=True, text=True, timeout=120, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def netns_problem() -> str | None:
    """Why this machine cannot run namespaced hosts, or None when it can."""
    if os.geteuid() != 0:
        return "namespaced worker hosts need root (ip netns add, veth pairs)"
    for tool in ("ip", "runuser"):
        if shutil.which(tool) is None:
            return f"namespaced worker hosts need `{tool}`, which is not on PATH"
    if not (PG_BIN / "pg_ctl").exists():
        return f"namespaced worker hosts need PostgreSQL 15's binaries in {PG_BIN}"
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"namespaced worker hosts need a {PG_USER!r} user to run PostgreSQL as"
    probe = f"tw-probe-{secrets.token_hex(4)}"
    try:
        _run("ip", "netns", "add", probe)
    except (RuntimeError, OSError) as exc:
        return f"`ip netns` is unavailable: {exc}"
    with suppress(RuntimeError, OSError):
        _run("ip", "netns", "del", probe)
    return None


def require_netns() -> None:
    """Skip with the reason when the machine cannot run namespaced hosts; under ``CI=true`` fail
    instead, as the PostgreSQL cases do (tests/conftest.py)."""
    problem = netns_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(problem)
    pytest.skip(problem)


@dataclass(frozen=True)
class Host:
    """One namespaced host: ``ns`` runs its processes; ``root_if``/``root_addr`` is the test's
    end of its link, ``ns_addr`` its own."""

    ns: str
    root_if: str
    ns_if: str
    root_addr: str
    ns_addr: str

    @property
    def subnet(self) -> str:
        return self.root_addr.rsplit(".", 1)[0] + ".0/24"

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace (an argv list, never a shell)."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def cut_link(self) -> None:
        """Take the test's end of the link down: the host can reach nothing any more."""
        _run("ip", "link", "set", self.root_if, "down")

    def restore_link(self) -> None:
        """Bring the test's end of the link up again (its address stayed configured)."""
        _run("ip", "link", "set", self.root_if, "up")


def _free_third_octets(count: int) -> list[int]:
    """``count`` values of X such that no address or route of this namespace is in
    10.231.X.0/24 (another run's hosts included)."""
    seen = _run("ip", "-4", "-o", "addr", "show")
    seen += _run("ip", "-4", "route", "show", "table", "all")
    taken = {
        int(word.split(".")[2])
        for word in seen.split()
        if word.startswith(f"{SUBNET_PREFIX}.") and word.count(".") == 3
    }
    free = [x for x in range(1, 255) if x not in taken]
    return random.sample(free, count)


@contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """``count`` namespaced hosts, each with its veth pair up; all deleted on the way out."""
    tag = secrets.token_hex(3)
    made: list[Host] = []
    try:
        # Another run choosing at the same moment would see none of our subnets yet: choosing
        # and addressing happen under one lock, so the next chooser sees ours taken.
        with _subnet_lock():
            _make_hosts(count, tag, made)
        yield made
    finally:
        for host in made:
            # Deleting the namespace deletes its end of the pair, and with it the other end;
            # the link is deleted by name too, in case the namespace was never made.
            with suppress(RuntimeError, OSError):
                _run("ip", "netns", "del", host.ns)
            with suppress(RuntimeError, OSError):
                _run("ip", "link", "del", host.root_if)


@contextmanager
def _subnet_lock() -> Iterator[None]:
    with open(Path(tempfile.gettempdir()) / "taskward-netns.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _make_hosts(count: int, tag: str, made: list[Host]) -> None:
    """Make ``count`` hosts, appending each to ``made`` before its first command (so the
    caller deletes whatever was made if one fails)."""
    for n, third in enumerate(_free_third_octets(count)):
        net = f"{SUBNET_PREFIX}.{third}"
        host = Host(f"tw-{tag}-{n}", f"tw{tag}r{n}", f"tw{tag}n{n}", f"{net}.1", f"{net}.2")
        made.append(host)
        _run("ip", "netns", "add", host.ns)
        _run("ip", "link", "add", host.root_if, "type", "veth", "peer", "name", host.ns_if)
        _run("ip", "link", "set", host.ns_if, "netns", host.ns)
        _run("ip", "addr", "add", f"{host.root_addr}/24", "dev", host.root_if)
        _run("ip", "link", "set", host.root_if, "up")
        inside = ("ip", "netns", "exec", host.ns, "ip")
        _run(*inside, "addr", "add", f"{host.ns_addr}/24", "dev", host.ns_if)
        _run(*inside, "link", "set", host.ns_if, "up")
        _run(*inside, "link", "set", "lo", "up")


@dataclass(frozen=True)
class PrivatePostgres:
    port: int
    socket_dir: Path

    def tcp_url(self, addr: str) -> str:
        return f"postgresql://{PG_USER}@{addr}:{self.port}/postgres"

    @property
    def local_url(self) -> str:
        """The test process's URL: the server's Unix socket."""
        return f"postgresql://{PG_USER}@/postgres?host={self.socket_dir}&port={self.port}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def private_postgres(
    listen: Sequence[Host], settings: Sequence[str] = ()
) -> Iterator[PrivatePostgres]:
    """A PostgreSQL 15 server of this test's own, run as the ``postgres`` user (it refuses
    root) in a temporary directory: it listens on each host's ``root_addr`` and trusts those
    subnets alone; ``settings`` are extra ``name = value`` lines. Stopped and deleted on exit."""
    user = pwd.getpwnam(PG_USER)
    home = Path(tempfile.mkdtemp(prefix="tw-netns-pg-"))  # 0700, short enough for the socket
    os.chown(home, user.pw_uid, user.pw_gid)
    data = home / "data"
    started = False
    try:
        _run(
            str(PG_BIN / "initdb"), "-D", str(data), "-U", PG_USER, "-A", "trust",
            "--no-sync", "-E", "UTF8", "--locale=C",
            user=PG_USER, cwd=home,
        )  # fmt: skip
        port = _free_port()
        addrs = ",".join(host.root_addr for host in listen)
        conf = [
            f"listen_addresses = '{addrs}'",
            f"port = {port}",
            f"unix_socket_directories = '{home}'",
            # a throwaway server: no durability needed, and less I/O on a shared machine
            "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = off",
            "shared_buffers = '16MB'",
            *settings,
        ]
        with (data / "postgresql.conf").open("a") as f:
            f.write("\n".join(conf) + "\n")
        hba = ["local all all trust", *(f"host all all {h.subnet} trust" for h in listen)]
        (data / "pg_hba.conf").write_text("\n".join(hba) + "\n")
        started = True
        log = home / "server.log"
        try:
            _run(
                str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "start",
                user=PG_USER, cwd=home,
            )  # fmt: skip
        except RuntimeError as exc:
            server_said = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{exc}\nserver log:\n{server_said}") from None
        yield PrivatePostgres(port, home)
    finally:
        if started:
            with suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
                _run(
                    str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop",
                    user=PG_USER, cwd=home,
                )  # fmt: skip
        shutil.rmtree(home, ignore_errors=True)


@dataclass
class HostProc:
    """A process running on a namespaced host; its stdout and stderr go to ``log_path``."""

    host: Host
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@contextmanager
def host_processes(
    started: Sequence[tuple[Host, Sequence[str]]], log_dir: Path
) -> Iterator[list[HostProc]]:
    """Start each argv inside its host's namespace (a session of its own, from the project
    root so ``tests.*`` task modules import); SIGKILL what is left on the way out."""
    procs: list[HostProc] = []
    try:
        for n, (host, argv) in enumerate(started):
            log_path = log_dir / f"{host.ns}-{n}.log"
            with log_path.open("wb") as log:
                proc = subprocess.Popen(
                    host.exec_argv(argv),
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            procs.append(HostProc(host, proc, log_path))
        yield procs
    finally:
        for item in procs:
            if item.proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(item.proc.pid, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                item.proc.wait(timeout=30)
