"""Instructions per task of the in-process drain, counted by callgrind: whole and per layer.

Callgrind counts the instructions a process executes (its own, in user space: no kernel work,
no fsync wait, no other process), so two runs of the same code agree to a few hundredths of a
percent where times on this shared machine move by 10-20 %, and ``perf stat`` has no counters.
Each measurement runs in a child process (this script with ``--child LAYER``) under
``valgrind --tool=callgrind --instr-atstart=no``; the child does its set-up (store, admission,
claims, recording) uninstrumented and brackets exactly the measured region with the client
requests ``CALLGRIND_START_INSTRUMENTATION`` / ``CALLGRIND_STOP_INSTRUMENTATION``. They stop
and start the count for every thread (the SQLite store's ``COMMIT`` thread is counted), so the
count is exact: the region and nothing else (the two requests themselves cost ~20,000
instructions in all). The count is then read from the callgrind output file, whole and by ELF
object (libpython, libsqlite3, uvloop, pydantic-core, libc, ...), self cost.

The layers. Callgrind sees CPython's C functions, not Python frames (Python 3.12's ``-X perf``
trampolines do not exist on 3.11), so the Python layers are measured by difference, each
under callgrind with the same N, concurrency, collector settings and ``PYTHONHASHSEED=0``:

- ``drain``: ``bench/inprocess.py``'s drain (a ``WorkerRuntime`` with the CLI's collector
  tuning, on uvloop) of N no-op tasks admitted beforehand; from the runtime's start to the
  N-th completion the host counts; then the audit check (2 facts, 2 events, 1 summary a task).
- ``host``: ``ResidentEngineHost`` over ``bench/host_overhead.py``'s in-memory source and
  summary store with a no-op ``run_task``: the host's own loop, no store, no adapter.
- ``adapter``: N calls of ``execute_lease(..., watchdog=False)`` (as ``AdapterRunner`` makes
  them) of the no-op ``@taskward.task`` on rows and leases of a real claim.
- ``sql`` (SQLite only): the statements of a drain, recorded as ``bench/sql_replay.py``
  records them, replayed through the bare ``sqlite3`` driver in a bare loop (COMMIT included);
  the replayed store must end as the drained one.
- ``taskward`` = drain - host - adapter - sql: ``LocalTaskSource``, the group commit, the
  transition and summary builders, the store's Python layer (on PostgreSQL also psycopg and
  libpq: no replay there).

On PostgreSQL only the worker process is counted, never the server's backends (they are other
processes, not run under valgrind).

Usage::

    .venv/bin/python bench/instructions.py                      # SQLite, 2,000 tasks, 2 repeats
    .venv/bin/python bench/instructions.py --backend postgres
    .venv/bin/python bench/instructions.py --src /tmp/before/src --layers drain
    .venv/bin/python bench/instructions.py --layers drain --otel api   # tracing's idle cost

``--otel`` (issue 28's tracing): ``none`` (default) leaves OpenTelemetry unimported, as an
application that does not trace; ``api`` imports ``opentelemetry.trace`` with no tracer
provider (the API's no-op tracer, as in ``taskward serve``/``up``, whose FastAPI imports it);
``sdk`` sets the SDK's tracer provider with no span processor (every span started and ended,
none exported). The child sets it up before the measured region.

It prints one JSON line on stdout (a table and progress on stderr); exit 1 on a violation.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import mmap
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # bench._common, after PYTHONPATH

from bench._common import DEFAULT_PG_URL, Stores, audit_store, progress, render_table

LAYERS = ("drain", "host", "adapter", "sql")
CHILD_TIMEOUT_S = 3600

# -- valgrind client requests (the child's side) ------------------------------------------------

# valgrind.h's client request on amd64 as a function ``f(args) -> result`` of the System V ABI:
# rax = args (request code, 5 arguments), rdx = the default result (0), the 16-byte "special
# instruction" preamble (rol rdi by 3, 13, 61, 51: 128 bits, so rdi ends unchanged), then
# ``xchg rbx, rbx`` (rdx = the request's result), return rdx. Outside valgrind the sequence is a
# no-op returning 0, so no compiler and no valgrind headers are needed.
_CLIENT_REQUEST_AMD64 = bytes.fromhex(
    "4889f8"  # mov rax, rdi
    "31d2"  # xor edx, edx
    "48c1c703"
    "48c1c70d"
    "48c1c73d"
    "48c1c733"  # the preamble
    "4887db"  # xchg rbx, rbx
    "4889d0"  # mov rax, rdx
    "c3"  # ret
)
_RUNNING_ON_VALGRIND = 0x1001
_CALLGRIND_BASE = (ord("C") << 24) | (ord("T") << 16)  # VG_USERREQ_TOOL_BASE('C','T')
_START_INSTRUMENTATION = _CALLGRIND_BASE + 4  # callgrind.h's enum order
_STOP_INSTRUMENTATION = _CALLGRIND_BASE + 5


class Region:
    """The measured region: ``start()`` and ``stop()`` switch callgrind's instrumentation on
    and off (for every thread). Each child calls them exactly once, around what it measures."""

    def __init__(self) -> None:
        if platform.machine() not in ("x86_64", "AMD64"):
            raise SystemExit(
                f"bench/instructions.py: client requests for amd64 only, not {platform.machine()}"
            )
        self._code = mmap.mmap(
            -1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
        )
        self._code.write(_CLIENT_REQUEST_AMD64)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._code))
        self._args = (ctypes.c_ulong * 6)()
        self._call = ctypes.CFUNCTYPE(ctypes.c_ulong, ctypes.c_void_p)(address)
        self.started = self.stopped = False

    def request(self, code: int) -> int:
        self._args[0] = code
        return int(self._call(ctypes.addressof(self._args)))

    def on_valgrind(self) -> bool:
        return self.request(_RUNNING_ON_VALGRIND) > 0

    def start(self) -> None:
        assert not self.started, "one region per child"
        self.started = True
        self.request(_START_INSTRUMENTATION)

    def stop(self) -> None:
        if self.started and not self.stopped:
            self.request(_STOP_INSTRUMENTATION)
            self.stopped = True


# -- the children: each measures one layer inside its Region and prints one JSON line ----------


def _registry() -> Any:
    """The built-in kinds and ``bench/noop.py``'s (not ``bench.inprocess.noop_registry``: a tree
    measured with ``--src`` may hold an older ``inprocess.py``; copy ``noop.py`` beside this)."""
    from bench import noop

    import taskward

    return taskward.build_registry(taskward.AdapterConfig(imports=(noop.MODULE,)))


def _run(main: Any) -> Any:
    """``main`` on the event loop the CLI's worker runs: uvloop where it is installed."""
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main)


def _group_counters(runtime: Any) -> tuple[int, int] | None:
    group = getattr(getattr(runtime, "summaries", None), "group", None)
    if group is None:
        return None
    return int(group.batches), int(group.units)


def child_drain(args: argparse.Namespace, region: Region) -> dict[str, Any]:
    from bench.inprocess import admit_noops, drain_noops

    import taskward

    counters: dict[str, tuple[int, int] | None] = {}

    def started(runtime: Any) -> None:
        counters["before"] = _group_counters(runtime)
        region.start()

    def finished(runtime: Any) -> None:
        region.stop()
        counters["after"] = _group_counters(runtime)

    async def drain(url: str) -> None:
        registry = _registry()
        async with taskward.open_db(url) as db:
            await admit_noops(db, registry, args.count, "instr")
            await drain_noops(
                db, registry, args.count, args.concurrency, started=started, finished=finished
            )

    stores = Stores(args.pg_url, None, "instr")
    try:
        store = stores.create(args.backend)
        _run(drain(store.url))
        audit = audit_store(store, args.count)
    finally:
        stores.close()
    out: dict[str, Any] = {"violations": audit.violations, "rows_per_task": audit.per_task()}
    before, after = counters.get("before"), counters.get("after")
    if before and after:
        batches, units = after[0] - before[0], after[1] - before[1]
        out.update(batches=batches, units_per_batch=round(units / max(batches, 1), 1))
    if args.backend == "postgres":
        import psycopg

        out["psycopg_impl"] = psycopg.pq.__impl__
    return out


def child_host(args: argparse.Namespace, region: Region) -> dict[str, Any]:
    from bench.host_overhead import MemorySource, MemorySummaries, make_tasks, noop

    from taskward.cli.common import tune_gc
    from taskward.host import ResidentEngineHost

    async def serve() -> MemorySource:
        tune_gc()  # as drain_noops (and the CLI's worker) does
        source = MemorySource(make_tasks(args.count))
        host = ResidentEngineHost(
            source=source,
            summaries=MemorySummaries(),
            max_concurrent_tasks=args.concurrency,
            session_factory=dict,
            run_task=noop,
        )
        region.start()
        serving = asyncio.get_running_loop().create_task(host.serve())
        await source.all_done.wait()
        region.stop()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        return source

    source = _run(serve())
    violations = list(source.failed)
    if any(n != 1 for n in source.completed.values()) or len(source.completed) != args.count:
        violations.append(f"{len(source.completed)} tasks completed, not each once of {args.count}")
    return {"violations": violations}


def child_adapter(args: argparse.Namespace, region: Region) -> dict[str, Any]:
    from bench.inprocess import admit_noops

    import taskward
    from taskward.claims import WorkerSpec, claim_rows, new_worker_id
    from taskward.cli.common import tune_gc
    from taskward.execution import execute_lease
    from taskward.registry import CancellationToken

    async def calls(url: str) -> Counter[str]:
        registry = _registry()
        spec = WorkerSpec(
            worker_id=new_worker_id(), kinds=tuple(registry.kinds()), lease_ttl=86400.0
        )
        claimed: list[Any] = []
        async with taskward.open_db(url) as db:
            await admit_noops(db, registry, args.count, "instr")
            while len(claimed) < args.count:
                got = await claim_rows(db, spec, limit=min(20, args.count - len(claimed)))
                if not got:
                    break
                claimed.extend(got)
        tokens = [CancellationToken() for _ in claimed]  # the source makes one per claim
        statuses: Counter[str] = Counter()
        tune_gc()
        region.start()
        for claim, token in zip(claimed, tokens, strict=True):
            result = await execute_lease(
                registry, claim.row, claim.lease, cancellation=token, watchdog=False
            )
            statuses[result.status] += 1
        region.stop()
        return statuses

    stores = Stores(args.pg_url, None, "instr")
    try:
        statuses = _run(calls(stores.create("sqlite").url))
    finally:
        stores.close()
    violations = [] if statuses == {"completed": args.count} else [f"adapter results {statuses}"]
    return {"violations": violations}


def child_sql(args: argparse.Namespace, region: Region) -> dict[str, Any]:
    from bench.sql_replay import Call, _replayed, admit, checkpoint, drain, store_state

    from taskward.store.sqlite.connection import set_pragmas

    stores = Stores(args.pg_url, None, "instr")
    try:
        store = stores.create("sqlite")
        path = Path(store.handle)
        snapshot = path.with_name(path.stem + "-before.db")
        asyncio.run(admit(store.url, args.count))
        checkpoint(path)
        shutil.copyfile(path, snapshot)
        calls: list[Call] = []
        _run(drain(store.url, args.count, args.concurrency, calls))
        violations = list(audit_store(store, args.count).violations)
        replayed = [call for call in calls if _replayed(call)]
        # Not sql_replay.replay(): its per-statement timing and naming is Python work the count
        # would include. Here: the driver's calls and nothing else (the store's own pragmas).
        conn = sqlite3.connect(str(snapshot), isolation_level=None, timeout=0)
        conn.execute("PRAGMA journal_mode=WAL").fetchone()
        set_pragmas(conn, "FULL")
        execute, executemany = conn.execute, conn.executemany
        region.start()
        for method, sql, params in replayed:
            if method == "executemany":
                executemany(sql, params)
            else:
                execute(sql, params).fetchall()
        region.stop()
        conn.close()
        if store_state(path) != store_state(snapshot):
            violations.append("the replayed store differs from the drained one")
        executions = sum(len(c[2]) if c[0] == "executemany" else 1 for c in replayed)
        return {
            "violations": violations,
            "calls_per_task": round(len(replayed) / args.count, 3),
            "executions_per_task": round(executions / args.count, 3),
            "commits_per_task": round(sum(1 for c in replayed if c[1] == "COMMIT") / args.count, 4),
        }
    finally:
        stores.close()


CHILDREN: dict[str, Callable[[argparse.Namespace, Region], dict[str, Any]]] = {
    "drain": child_drain,
    "host": child_host,
    "adapter": child_adapter,
    "sql": child_sql,
}


def set_up_tracing(mode: str) -> None:
    """``--otel``: OpenTelemetry left alone, its API imported, or the SDK's provider set."""
    if mode == "none":
        return
    from opentelemetry import trace

    if mode == "sdk":
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())


def run_child(args: argparse.Namespace) -> int:
    region = Region()
    if not region.on_valgrind() and not args.native:
        print("--child runs under valgrind (bench/instructions.py starts it so)", file=sys.stderr)
        return 2
    import taskward

    set_up_tracing(args.otel)
    out = CHILDREN[args.child](args, region)
    if not (region.started and region.stopped):
        out["violations"].append("the measured region was not started and stopped once")
    out["taskward"] = str(Path(taskward.__file__).parent)
    print(json.dumps(out))
    return 0


# -- the parent: valgrind, the output files, the budget -----------------------------------------


def valgrind_argv(out_file: Path, child: Sequence[str], nice: int) -> list[str]:
    """The child's command line: ``nice``, callgrind with instrumentation off until the
    child's region starts, this interpreter running this script."""
    argv = ["nice", "-n", str(nice)] if nice else []
    return [
        *argv,
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out_file}",
        sys.executable,
        str(Path(__file__).resolve()),
        *child,
    ]


_COMPRESSED = re.compile(r"\((\d+)\)(?: (.*))?$")


def read_callgrind(path: Path) -> tuple[int, dict[str, int]]:
    """Total ``Ir`` of a callgrind output file and its self cost by ELF object (basename).

    The format (valgrind's "Callgrind Format Specification"): ``ob=`` sets the object of the
    cost lines that follow (``cob=`` names a callee's object, sharing the compressed ``(id)``
    names); the cost line right after ``calls=`` is a call's inclusive cost, not self cost."""
    names: dict[str, str] = {}
    by_object: Counter[str] = Counter()
    total: int | None = None
    positions, ir = 1, 0
    current = "???"
    after_call = False
    with open(path) as f:
        for line in f:
            first = line[:1]
            if first.isdigit() or first in "+-*":
                if after_call:
                    after_call = False
                    continue
                fields = line.split()
                if len(fields) > positions + ir:
                    by_object[current] += int(fields[positions + ir])
                continue
            key, eq, value = line.rstrip("\n").partition("=")
            if eq and key in ("ob", "cob"):
                match = _COMPRESSED.match(value)
                if match is not None:
                    if match.group(2) is not None:
                        names[match.group(1)] = match.group(2)
                    value = names.get(match.group(1), "???")
                if key == "ob":
                    current = Path(value).name or value
            elif eq and key == "calls":
                after_call = True
            elif line.startswith("positions:"):
                positions = len(line.split()) - 1
            elif line.startswith("events:"):
                ir = line.split()[1:].index("Ir")
            elif line.startswith("totals:"):
                total = int(line.split()[1 + ir])
    self_total = sum(by_object.values())
    if total is None:
        total = self_total
    elif total != self_total:
        raise ValueError(f"{path}: self costs add up to {self_total}, totals: {total}")
    return total, dict(by_object)


def budget(per_task: dict[str, float]) -> dict[str, float]:
    """The layers measured and taskward's own layer: the drain minus the other layers."""
    out = dict(per_task)
    if "drain" in per_task and all(k in per_task for k in ("host", "adapter")):
        out["taskward"] = per_task["drain"] - sum(
            per_task[k] for k in ("host", "adapter", "sql") if k in per_task
        )
    return out


def tree_version(taskward_dir: str) -> dict[str, Any]:
    """The commit of the git tree holding the taskward measured, and whether its src differs."""

    def git(*argv: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", taskward_dir, *argv], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD") or "?",
        "src_dirty": bool(git("status", "--porcelain", "--", ".")),
    }


def measure(args: argparse.Namespace, layer: str, out_dir: Path, tag: str) -> dict[str, Any]:
    """One child under callgrind: its JSON line, its count (total and by object)."""
    out_file = out_dir / f"callgrind.{layer}.{tag}.out"
    child = [
        "--child",
        layer,
        "--count",
        str(args.count),
        "--concurrency",
        str(args.concurrency),
        "--backend",
        args.backend,
        "--pg-url",
        args.pg_url,
        "--otel",
        args.otel,
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")  # str hashes, so dict probes, repeat exactly
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(args.src).resolve()), env.get("PYTHONPATH", "")) if p
        )
    done = subprocess.run(
        valgrind_argv(out_file, child, args.nice),
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"{layer}: exit status {done.returncode}\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["total"], result["by_object"] = read_callgrind(out_file)
    return result


def run_parent(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    layers = [layer for layer in args.layers if layer != "sql" or args.backend == "sqlite"]
    out_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="taskward-instr-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    repeats: list[dict[str, dict[str, Any]]] = []
    try:
        for i in range(args.repeat):
            runs: dict[str, dict[str, Any]] = {}
            for layer in layers:
                runs[layer] = run = measure(args, layer, out_dir, f"{args.backend}.{i + 1}")
                progress(
                    f"[{i + 1}/{args.repeat}] {layer}: {run['total'] / args.count:,.0f} "
                    f"instructions a task; {len(run['violations'])} violation(s)"
                )
            repeats.append(runs)
    finally:
        if not args.keep:
            shutil.rmtree(out_dir, ignore_errors=True)
    report = make_report(args, layers, repeats)
    progress(render_report(report))
    print(json.dumps(report))
    return 1 if report["violations"] else 0


def make_report(
    args: argparse.Namespace, layers: Sequence[str], repeats: Sequence[dict[str, dict[str, Any]]]
) -> dict[str, Any]:
    """The JSON report: instructions a task by layer (median over repeats, and each repeat),
    the spread between repeats, each layer's self cost by object (first repeat), and what the
    children reported beside their count (the drain's batches, the replay's statements)."""
    per_repeat = [budget({k: runs[k]["total"] / args.count for k in layers}) for runs in repeats]
    median = {k: round(statistics.median(r[k] for r in per_repeat)) for k in per_repeat[0]}
    spread = {
        k: round((max(r[k] for r in per_repeat) / min(r[k] for r in per_repeat) - 1) * 100, 3)
        for k in layers
    }
    first = repeats[0]
    shown = {  # objects holding at least 0.1 % of some layer's count
        name
        for run in first.values()
        for name, ir in run["by_object"].items()
        if ir >= run["total"] / 1000
    }
    by_object = [
        {
            "object": name,
            **{k: round(first[k]["by_object"].get(name, 0) / args.count) for k in layers},
        }
        for name in shown
    ]
    by_object.sort(key=lambda row: [-row[k] for k in layers])
    own = ("total", "by_object", "violations", "taskward")
    taskward_dir = first[layers[0]]["taskward"]
    return {
        "instructions_per_task": median,
        "repeats": [{k: round(v) for k, v in r.items()} for r in per_repeat],
        "spread_pct": spread,
        "by_object_per_task": by_object,
        "children": [
            {k: {f: v for f, v in run.items() if f not in own} for k, run in runs.items()}
            for runs in repeats
        ],
        "backend": args.backend,
        "otel": args.otel,
        "count": args.count,
        "concurrency": args.concurrency,
        "taskward": taskward_dir,
        **tree_version(taskward_dir),
        "python": platform.python_version(),
        "valgrind": subprocess.run(
            ["valgrind", "--version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "violations": [
            f"{layer}: {v}"
            for runs in repeats
            for layer, run in runs.items()
            for v in run["violations"]
        ],
    }


def render_report(report: dict[str, Any]) -> str:
    """The report as two tables: the layers by repeat, and the layers by object."""
    per_task, spread = report["instructions_per_task"], report["spread_pct"]
    runs = report["repeats"]
    text = render_table(
        [
            "layer (instructions a task)",
            "median",
            *(f"run {i + 1}" for i in range(len(runs))),
            "spread",
        ],
        [
            [
                layer,
                f"{per_task[layer]:,}",
                *(f"{r[layer]:,}" for r in runs),
                f"{spread[layer]:.3f} %" if layer in spread else "",
            ]
            for layer in per_task
        ],
    )
    layers = list(spread)
    rows = report["by_object_per_task"]
    return (
        text
        + "\n\n"
        + render_table(
            ["self cost by object (a task, run 1)", *layers],
            [[row["object"], *(f"{row[k]:,}" for k in layers)] for row in rows],
        )
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--count", type=int, default=2_000, help="tasks a layer (2,000)")
    parser.add_argument("--concurrency", type=int, default=128, help="host slots (128)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of every layer (2)")
    parser.add_argument(
        "--layers",
        default=",".join(LAYERS),
        help="comma-separated, of " + ", ".join(LAYERS) + " (sql: SQLite only)",
    )
    parser.add_argument("--src", default="", help="a taskward src directory to measure (A/B)")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument(
        "--otel",
        choices=("none", "api", "sdk"),
        default="none",
        help="OpenTelemetry in the children: not imported, the API without a provider, or "
        "the SDK's provider without an exporter (none)",
    )
    parser.add_argument("--nice", type=int, default=10, help="niceness of the children (10)")
    parser.add_argument("--keep", default="", help="keep the callgrind files in this directory")
    parser.add_argument("--child", choices=LAYERS, help=argparse.SUPPRESS)
    parser.add_argument("--native", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.layers = [layer.strip() for layer in args.layers.split(",") if layer.strip()]
    unknown = sorted(set(args.layers) - set(LAYERS))
    if unknown or not args.layers:
        parser.error(f"--layers: {', '.join(unknown) or 'none'}; allowed: {', '.join(LAYERS)}")
    if args.count < 1 or args.concurrency < 1 or args.repeat < 1:
        parser.error("--count, --concurrency and --repeat must be at least 1")
    if not 0 <= args.nice <= 19:
        parser.error("--nice must be 0-19")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_child(args) if args.child else run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
