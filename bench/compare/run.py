"""taskward beside Procrastinate, PgQueuer, Huey and the raw-SQL floors, in one interleaved run.

Usage (from the repository root, with taskward's virtual environment):

    .venv/bin/python bench/compare/run.py --quick          # small counts, 1 repeat, a few minutes
    .venv/bin/python bench/compare/run.py                  # 10,000 jobs, 5 interleaved repeats
    .venv/bin/python bench/compare/run.py --repeat 3 --jobs 5000 --json > compare.json

Each system is measured by its adapter script (``system_*.py``), one subprocess per measurement,
in a fresh PostgreSQL schema or SQLite file; peers run in their own virtual environments built
from ``requirements/<peer>.txt`` on first use (under ``$TASKWARD_COMPARE_HOME``, default
``/tmp/taskward-compare``, never in the repository) and reused while the file is unchanged.
Within a repeat, each workload is measured for every system back to back (the system order
rotates between repeats), so the ratios compare measurements taken minutes apart at most.
Each adapter checks its store after the run; any violation is printed and makes the exit status 1.
See README.md beside this file for what each system does per job.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
for _path in (str(HERE), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import _adapter as A  # noqa: E402
import psycopg  # noqa: E402
from bench._common import (  # noqa: E402
    DEFAULT_PG_URL,
    code_version,
    machine_description,
    median,
    progress,
    remove_sqlite_file,
    render_table,
)

HOME = Path(os.environ.get("TASKWARD_COMPARE_HOME", "/tmp/taskward-compare"))
WORKLOADS = A.WORKLOADS


@dataclass(frozen=True)
class System:
    key: str
    name: str  # shown in tables
    store: str  # shown in tables
    worker: str  # shown in tables: how the drain/pickup worker runs
    script: str
    backend: str
    peer: str | None  # requirements/<peer>.txt and its venv; None: taskward's own venv
    workloads: tuple[str, ...]
    extra: tuple[str, ...] = ()


# The batched floor: the same writes with 64 jobs sharing each transaction, the most any worker
# could drain with this schema and synchronous=FULL in one process (no framework, no guarantee).
FLOOR_BATCH = 64


def systems(args: argparse.Namespace) -> list[System]:
    tw_c = ("--concurrency", str(args.taskward_concurrency))
    return [
        System(
            "taskward-sqlite",
            "taskward",
            "SQLite WAL, synchronous=FULL",
            f"1 process, concurrency {args.taskward_concurrency}",
            "system_taskward.py",
            "sqlite",
            None,
            WORKLOADS,
            tw_c,
        ),
        *(
            System(
                f"taskward-{backend}-p{n}",
                "taskward",
                "SQLite WAL, synchronous=FULL" if backend == "sqlite" else "PostgreSQL",
                f"{n} processes (--processes {n}), concurrency {args.taskward_concurrency} each",
                "system_taskward.py",
                backend,
                None,
                ("drain",),
                (*tw_c, "--processes", str(n)),
            )
            for backend in ("sqlite", "postgres")
            for n in args.taskward_processes
            if n > 1
        ),
        System(
            "huey",
            "Huey",
            "SQLite WAL, synchronous=FULL (fsync=True)",
            f"1 consumer, {args.huey_workers} worker thread(s)",
            "system_huey.py",
            "sqlite",
            "huey",
            WORKLOADS,
            ("--concurrency", str(args.huey_workers)),
        ),
        System(
            "floor-sqlite",
            "raw-SQL floor",
            "SQLite WAL, synchronous=FULL",
            "in-process, 1 job at a time",
            "system_floor.py",
            "sqlite",
            None,
            ("enqueue", "drain"),
        ),
        System(
            "floor-sqlite-b64",
            "raw-SQL floor, 64 jobs per transaction",
            "SQLite WAL, synchronous=FULL",
            "in-process, 64 claims then 64 completions per transaction",
            "system_floor.py",
            "sqlite",
            None,
            ("drain",),
            ("--batch", str(FLOOR_BATCH)),
        ),
        System(
            "taskward-postgres",
            "taskward",
            "PostgreSQL",
            f"1 process, concurrency {args.taskward_concurrency}",
            "system_taskward.py",
            "postgres",
            None,
            WORKLOADS,
            tw_c,
        ),
        System(
            "procrastinate",
            "Procrastinate",
            "PostgreSQL",
            f"1 process, concurrency {args.procrastinate_concurrency}",
            "system_procrastinate.py",
            "postgres",
            "procrastinate",
            WORKLOADS,
            ("--concurrency", str(args.procrastinate_concurrency)),
        ),
        System(
            "pgqueuer-b10",
            "PgQueuer batch 10",
            "PostgreSQL",
            "1 process, batch 10, unlimited tasks",
            "system_pgqueuer.py",
            "postgres",
            "pgqueuer",
            WORKLOADS,
            ("--batch", "10"),
        ),
        System(
            "pgqueuer-b100",
            "PgQueuer batch 100",
            "PostgreSQL",
            "1 process, batch 100, unlimited tasks",
            "system_pgqueuer.py",
            "postgres",
            "pgqueuer",
            ("drain",),
            ("--batch", "100"),
        ),
        System(
            "floor-postgres",
            "raw-SQL floor",
            "PostgreSQL, one connection",
            "in-process, 1 job at a time",
            "system_floor.py",
            "postgres",
            None,
            ("enqueue", "drain"),
        ),
        # Not a goal's baseline: the floor's INSERT over psycopg's asyncio connection, so that
        # the report tells the asynchronous driver's cost from taskward's own.
        System(
            "floor-postgres-async",
            "raw-SQL floor, asynchronous driver",
            "PostgreSQL, one connection",
            "in-process (enqueue only), psycopg AsyncConnection",
            "system_floor.py",
            "postgres",
            None,
            ("enqueue",),
            ("--driver", "async"),
        ),
    ]


# Ratios: (taskward system, other system). Throughput: taskward / other; latency: other / taskward
# (so above 1 always means taskward is ahead).
PAIRS = (
    ("taskward-sqlite", "floor-sqlite"),
    ("taskward-sqlite", "floor-sqlite-b64"),
    ("taskward-sqlite", "huey"),
    ("taskward-postgres", "floor-postgres"),
    ("taskward-postgres", "floor-postgres-async"),
    ("taskward-postgres", "procrastinate"),
    ("taskward-postgres", "pgqueuer-b10"),
    ("taskward-postgres", "pgqueuer-b100"),
    # R26's worker processes against taskward's own one-process drain (issue 27's goals)
    ("taskward-sqlite-p2", "taskward-sqlite"),
    ("taskward-postgres-p2", "taskward-postgres"),
    ("taskward-postgres-p2", "pgqueuer-b10"),
)


# -- virtual environments -------------------------------------------------------------------------


def ensure_venv(peer: str) -> Path:
    """The python of ``peer``'s virtual environment, created and filled on first use.

    The directory name carries a hash of the requirements file, so a changed pin builds a new
    environment; a half-built one (no marker) is rebuilt.
    """
    requirements = HERE / "requirements" / f"{peer}.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:10]
    venv = HOME / "venvs" / f"{peer}-{digest}"
    python = venv / "bin" / "python"
    marker = venv / ".taskward-compare-installed"
    if marker.exists() and python.exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    progress(f"creating the {peer} environment in {venv} from {requirements.name} ...")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
            str(requirements),
        ],
        check=True,
    )
    marker.write_text(digest + "\n")
    return python


# -- fresh stores ---------------------------------------------------------------------------------


class FreshStores:
    """A fresh PostgreSQL schema or SQLite file per measurement; all removed at the end."""

    def __init__(self, pg_url: str) -> None:
        self.pg_url = pg_url
        tag = f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{os.getpid()}"
        self.directory = HOME / "runs" / tag
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix = f"cmp_{os.getpid()}_{uuid.uuid4().hex[:4]}"
        self.n = 0
        self.schemas: list[str] = []

    def create(self, backend: str) -> tuple[list[str], str]:
        self.n += 1
        if backend == "sqlite":
            path = self.directory / f"m{self.n}.db"
            return ["--sqlite-path", str(path)], str(path)
        schema = f"{self.prefix}_{self.n}"
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        self.schemas.append(schema)
        return ["--pg-url", self.pg_url, "--schema", schema], schema

    def remove(self, backend: str, handle: str) -> None:
        if backend == "sqlite":
            remove_sqlite_file(Path(handle))
            for side in Path(handle).parent.glob(Path(handle).name + ".*"):
                side.unlink(missing_ok=True)
            return
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {handle} CASCADE")
        self.schemas.remove(handle)

    def close(self) -> None:
        try:
            for schema in list(self.schemas):
                self.remove("postgres", schema)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


# -- one measurement ------------------------------------------------------------------------------


def counts(args: argparse.Namespace, workload: str) -> int:
    return {"enqueue": args.enqueue_jobs, "drain": args.jobs, "pickup": args.pickup_jobs}[workload]


def measure(
    system: System,
    workload: str,
    repeat: int,
    args: argparse.Namespace,
    python: str,
    stores: FreshStores,
) -> dict[str, Any]:
    store_args, handle = stores.create(system.backend)
    jobs = counts(args, workload)
    argv = [
        python,
        str(HERE / system.script),
        "--workload",
        workload,
        "--backend",
        system.backend,
        *store_args,
        "--jobs",
        str(jobs),
        "--warmup",
        str(args.warmup),
        "--interval-ms",
        str(args.pickup_interval_ms),
        "--workdir",
        str(stores.directory),
        "--timeout-s",
        str(args.timeout_s),
        *system.extra,
    ]
    env = dict(os.environ)
    for name in ("TASKWARD_DATABASE_URL", "TASKWARD_IMPORTS", "PYTHONPATH"):
        env.pop(name, None)
    began = time.monotonic()
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=args.timeout_s + 120
        )
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, code = str(exc.stdout or ""), str(exc.stderr or ""), None
    finally:
        try:
            stores.remove(system.backend, handle)
        except Exception as exc:  # a leftover schema must not end the run
            progress(f"  could not remove {handle}: {exc}")
    lines = [line for line in stdout.splitlines() if line.startswith(A.RESULT_PREFIX)]
    if lines:
        result: dict[str, Any] = json.loads(lines[-1][len(A.RESULT_PREFIX) :])
    else:
        tail = stderr.strip()[-1500:]
        result = {"violations": [f"adapter exited with {code} and no result:\n{tail}"]}
    if "error" in result:
        progress(f"  adapter error, stderr tail:\n{stderr.strip()[-1500:]}")
    result.update(
        key=system.key,
        workload=workload,
        repeat=repeat,
        jobs=jobs,
        process_s=round(time.monotonic() - began, 2),
    )
    result.setdefault("violations", [])
    progress(describe(system, workload, repeat, args, result))
    return result


def describe(
    system: System, workload: str, repeat: int, args: argparse.Namespace, r: dict[str, Any]
) -> str:
    head = f"[repeat {repeat + 1}/{args.repeat} {workload:7}] {system.key:17}"
    if workload == "pickup" and "p50_ms" in r:
        body = f"p50 {r['p50_ms']:7.1f} ms  p95 {r['p95_ms']:7.1f} ms  ({r['jobs']} jobs)"
    elif "per_s" in r:
        body = f"{r['jobs']:6} jobs {r['seconds']:7.2f} s = {r['per_s']:8.0f}/s"
        if r.get("steady_per_s"):
            body += f"  (steady {r['steady_per_s']:.0f}/s)"
        if r.get("sync_per_s"):
            body += f"  (SyncClient {r['sync_per_s']:.0f}/s)"
        if r.get("bulk_per_s"):
            body += f"  (bulk {r['bulk_per_s']:.0f}/s)"
    else:
        body = "no figure"
    rows = r.get("rows_per_job")
    if rows:
        body += "  rows/job " + " ".join(f"{k} {v:.2f}" for k, v in rows.items())
    verdict = "ok" if not r["violations"] else "VIOLATIONS: " + "; ".join(r["violations"])
    return f"{head} {body}  [{r['process_s']:.0f} s]  {verdict}"


# -- summary --------------------------------------------------------------------------------------


def nan() -> float:
    return float("nan")


def med(values: list[float]) -> float:
    values = [v for v in values if v is not None and v == v]
    return median(values) if values else nan()


def summarise(results: list[dict[str, Any]], all_systems: list[System]) -> dict[str, Any]:
    medians: dict[str, dict[str, dict[str, Any]]] = {}
    for system in all_systems:
        mine = [r for r in results if r["key"] == system.key]
        per: dict[str, dict[str, Any]] = {}
        for workload in system.workloads:
            runs = [r for r in mine if r["workload"] == workload]
            if not runs:
                continue
            entry: dict[str, Any] = {"n": len(runs)}
            if workload == "pickup":
                entry["p50_ms"] = med([r.get("p50_ms") for r in runs])
                entry["p95_ms"] = med([r.get("p95_ms") for r in runs])
                pooled = [v for r in runs for v in r.get("latencies_ms", [])]
                entry["pooled_p50_ms"] = A.percentile(pooled, 50)
                entry["samples_p50_ms"] = [round(r.get("p50_ms", nan()), 2) for r in runs]
            else:
                entry["per_s"] = med([r.get("per_s") for r in runs])
                entry["samples_per_s"] = [round(r.get("per_s", nan()), 1) for r in runs]
                if workload == "drain":
                    entry["steady_per_s"] = med([r.get("steady_per_s") for r in runs])
                if workload == "enqueue" and any("bulk_per_s" in r for r in runs):
                    entry["bulk_per_s"] = med([r.get("bulk_per_s") for r in runs])
                if workload == "enqueue" and any("sync_per_s" in r for r in runs):
                    entry["sync_per_s"] = med([r.get("sync_per_s") for r in runs])
            entry["violations"] = sum(len(r["violations"]) for r in runs)
            rows = [r.get("rows_per_job") for r in runs if r.get("rows_per_job")]
            if rows:
                entry["rows_per_job"] = rows[-1]
            per[workload] = entry
        medians[system.key] = per

    def value(key: str, workload: str, field: str) -> float:
        return float(medians.get(key, {}).get(workload, {}).get(field, nan()))

    ratios: dict[str, dict[str, float]] = {}
    for ours, theirs in PAIRS:
        pair: dict[str, float] = {}
        for workload in WORKLOADS:
            if workload == "pickup":
                a, b = value(theirs, workload, "p50_ms"), value(ours, workload, "p50_ms")
            else:
                a, b = value(ours, workload, "per_s"), value(theirs, workload, "per_s")
            pair[workload] = a / b if a == a and b == b and b else nan()
            # per-repeat ratios (same repeat, minutes apart), for the JSON
            field = "p50_ms" if workload == "pickup" else "per_s"
            same = []
            for r in {x["repeat"] for x in results}:
                x = [
                    v.get(field)
                    for v in results
                    if v["key"] == ours and v["workload"] == workload and v["repeat"] == r
                ]
                y = [
                    v.get(field)
                    for v in results
                    if v["key"] == theirs and v["workload"] == workload and v["repeat"] == r
                ]
                if x and y and x[0] and y[0]:
                    same.append(y[0] / x[0] if workload == "pickup" else x[0] / y[0])
            pair[f"{workload}_per_repeat"] = [round(v, 3) for v in same]  # type: ignore[assignment]
        ratios[f"{ours} vs {theirs}"] = pair

    def ratio(ours: str, theirs: str, workload: str) -> float:
        return ratios[f"{ours} vs {theirs}"][workload]

    def verdict(x: float, aim: float, fail: float | None = None) -> str:
        if x != x:
            return "not measured"
        if x >= aim:
            return "met"
        if fail is not None and x >= fail:
            return "missed the aim (above the failure line)"
        return "MISSED" if fail is None else "FAILED"

    goals: list[dict[str, Any]] = []

    def goal(text: str, figure: float, unit: str, status: str) -> None:
        goals.append({"goal": text, "figure": figure, "unit": unit, "status": status})

    x = ratio("taskward-sqlite", "huey", "drain")
    goal("drain on SQLite >= 1.5x Huey-on-SQLite", x, "x", verdict(x, 1.5))
    ceiling = value("floor-sqlite-b64", "drain", "per_s") / value("huey", "drain", "per_s")
    goal(
        "(ceiling, not a goal) the batched raw-SQL floor's drain / Huey's",
        ceiling,
        "x",
        "not measured" if ceiling != ceiling else "info",
    )
    x = ratio("taskward-postgres", "pgqueuer-b10", "drain")
    goal(
        "drain on PostgreSQL: aim >= 1.0x PgQueuer batch 10; < 0.6x fails",
        x,
        "x",
        verdict(x, 1.0, 0.6),
    )
    x = ratio("taskward-postgres-p2", "taskward-postgres", "drain")
    goal("no-op drain on PostgreSQL, --processes 2 >= 1.3x one process", x, "x", verdict(x, 1.3))
    x = ratio("taskward-postgres", "procrastinate", "drain")
    goal("drain on PostgreSQL: aim >= 5x Procrastinate; < 3x fails", x, "x", verdict(x, 5.0, 3.0))
    for backend in ("sqlite", "postgres"):
        x = ratio(f"taskward-{backend}", f"floor-{backend}", "enqueue")
        goal(
            f"admission one per call on {backend} >= 0.8x the raw-SQL insert floor",
            x,
            "x",
            verdict(x, 0.8),
        )
        # The same goal for the synchronous client: the floor's driver path is synchronous too.
        x = value(f"taskward-{backend}", "enqueue", "sync_per_s") / value(
            f"floor-{backend}", "enqueue", "per_s"
        )
        goal(
            f"admission one per call on {backend} (SyncClient) >= 0.8x the raw-SQL insert floor",
            x,
            "x",
            verdict(x, 0.8),
        )
    for backend in ("sqlite", "postgres"):
        single = value(f"taskward-{backend}", "enqueue", "per_s")
        bulk = value(f"taskward-{backend}", "enqueue", "bulk_per_s")
        x = bulk / single if single == single and single else nan()
        goal(
            f"bulk submit_tasks on {backend} >= 10x taskward's single-call rate",
            x,
            "x",
            verdict(x, 10.0),
        )
    for backend, limit in (("sqlite", 10.0), ("postgres", 3.0)):
        p50 = value(f"taskward-{backend}", "pickup", "p50_ms")
        status = "not measured" if p50 != p50 else ("met" if p50 <= limit else "MISSED")
        goal(f"pickup p50 on {backend} <= {limit:g} ms", p50, "ms", status)
    return {"medians": medians, "ratios": ratios, "goals": goals}


def fmt(value: Any, spec: str = ",.0f", suffix: str = "") -> str:
    if value is None or value != value:
        return "-"
    return format(value, spec) + suffix


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table, every column left-aligned (for text)."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [headers, *rows]
    ]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def print_report(
    summary: dict[str, Any],
    all_systems: list[System],
    context: dict[str, Any],
    violations: list[str],
    args: argparse.Namespace,
) -> None:
    medians = summary["medians"]
    print(f"bench/compare {context['date']} — {context['method']}")
    print("context: " + ", ".join(f"{k} {v}" for k, v in context["machine"].items()))
    print("versions: " + ", ".join(f"{k} {v}" for k, v in context["versions"].items()))
    print()
    rows = []
    for s in all_systems:
        m = medians.get(s.key, {})
        enq, drn, pick = m.get("enqueue", {}), m.get("drain", {}), m.get("pickup", {})
        bad = sum(v.get("violations", 0) for v in m.values())
        rows.append(
            [
                s.key,
                fmt(enq.get("per_s")),
                fmt(drn.get("per_s")),
                fmt(drn.get("steady_per_s")),
                fmt(pick.get("p50_ms"), ".1f"),
                fmt(pick.get("p95_ms"), ".1f"),
                str(bad),
            ]
        )
    print(
        render_table(
            ["system", "enqueue/s", "drain/s", "steady/s", "pickup p50 ms", "p95 ms", "violations"],
            rows,
        )
    )
    print()
    print(
        table(
            ["system", "store", "worker (drain and pickup)"],
            [[s.key, s.store, s.worker] for s in all_systems],
        )
    )
    print(
        "  enqueue: 1 job per call, 1 client; drain: from the worker's spawn until every job is "
        "seen done (start-up included); steady: the system's own first-take -> last-completion "
        "timestamps (floors: the whole loop); medians over "
        f"{args.repeat} interleaved repeat(s)."
    )
    tw = medians.get("taskward-sqlite", {}).get("enqueue", {}).get("bulk_per_s")
    tp = medians.get("taskward-postgres", {}).get("enqueue", {}).get("bulk_per_s")
    print(
        f"  taskward bulk submit_tasks (chunks of 1,000): SQLite {fmt(tw)}/s, "
        f"PostgreSQL {fmt(tp)}/s"
    )
    sw = medians.get("taskward-sqlite", {}).get("enqueue", {}).get("sync_per_s")
    sp = medians.get("taskward-postgres", {}).get("enqueue", {}).get("sync_per_s")
    print(
        f"  taskward SyncClient.submit_task, 1 per call: SQLite {fmt(sw)}/s, PostgreSQL {fmt(sp)}/s"
    )
    print_drift(medians, all_systems)
    print()
    ratio_rows = []
    keys = {s.key for s in all_systems}
    for ours, theirs in PAIRS:
        if ours not in keys or theirs not in keys:
            continue
        r = summary["ratios"][f"{ours} vs {theirs}"]
        row = [f"{ours} vs {theirs}"]
        for workload in WORKLOADS:
            same = r.get(f"{workload}_per_repeat") or []
            spread = f"{min(same):.2f}-{max(same):.2f}" if len(same) > 1 else ""
            row += [fmt(r[workload], ".2f", "x"), spread]
        ratio_rows.append(row)
    print(
        render_table(
            [
                "ratio (above 1: taskward ahead)",
                "enqueue",
                "range",
                "drain",
                "range",
                "pickup p50",
                "range",
            ],
            ratio_rows,
        )
    )
    print(
        "  enqueue and drain: taskward rate / other rate; pickup: other p50 / taskward p50; "
        "ratio of the medians, and the range of the ratios within each repeat."
    )
    print()
    print("rows written per job (last run checked):")
    for s in all_systems:
        rows_per = medians.get(s.key, {}).get("drain", {}).get("rows_per_job")
        if rows_per:
            print(f"  {s.key:17} " + ", ".join(f"{k} {v:.2f}" for k, v in rows_per.items()))
    print()
    print("goals of issues 7 and 27 measured here:")
    for g in summary["goals"]:
        figure = fmt(g["figure"], ".2f", g["unit"] if g["unit"] == "x" else " ms")
        print(f"  {g['status']:>40}  {figure:>9}  {g['goal']}")
    print()
    print(f"violations: {len(violations)}")
    for v in violations:
        print(f"  {v}")


def print_drift(medians: dict[str, Any], all_systems: list[System]) -> None:
    """The floors' drain rate repeat by repeat, in the order measured: they run in-process,
    with no start-up and no peer, so their spread is the machine's own drift over the run (a
    shared machine's speed moved 25-30 % within one run), against which every ratio's range
    should be read."""
    drift = [
        (s.key, medians.get(s.key, {}).get("drain", {}).get("samples_per_s") or [])
        for s in all_systems
        if s.key.startswith("floor-")
    ]
    drift = [(key, samples) for key, samples in drift if len(samples) > 1 and samples[0]]
    if not drift:
        return
    print("  machine drift across repeats (the floors' drains: in-process, no start-up, no peer):")
    for key, samples in drift:
        rates = " -> ".join(fmt(v) for v in samples)
        spread = max(samples) / min(samples)
        print(f"    {key:17} {rates}/s (the fastest repeat {spread:.2f}x the slowest)")


# -- main -----------------------------------------------------------------------------------------


def no_nan(value: Any) -> Any:
    """``value`` with every NaN (a figure not measured) as None, so the JSON is strict."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [no_nan(v) for v in value]
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small counts and 1 repeat (jobs 1000, enqueue 500, pickup 50)",
    )
    parser.add_argument("--repeat", type=int, default=None, help="interleaved repeats (5)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per drain (10000)")
    parser.add_argument(
        "--enqueue-jobs",
        type=int,
        default=None,
        help="jobs per enqueue measurement (default: --jobs)",
    )
    parser.add_argument("--pickup-jobs", type=int, default=None, help="timed pickups (200)")
    parser.add_argument("--pickup-interval-ms", type=float, default=20.0)
    parser.add_argument("--warmup", type=int, default=None, help="untimed jobs first (20)")
    parser.add_argument(
        "--systems",
        default=None,
        help="comma-separated subset of: "
        + ", ".join(
            s.key
            for s in systems(
                argparse.Namespace(
                    taskward_concurrency=128,
                    taskward_processes=[1, 2],
                    huey_workers=1,
                    procrastinate_concurrency=10,
                )
            )
        ),
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--taskward-concurrency", type=int, default=128)
    parser.add_argument(
        "--taskward-processes",
        type=lambda text: [int(n) for n in text.split(",") if n],
        default=[1, 2],
        help="worker process counts for taskward's drain (R26; 1 is the plain taskward-* "
        "systems; each other count adds taskward-<backend>-p<N>), e.g. 1,2",
    )
    parser.add_argument("--procrastinate-concurrency", type=int, default=10)
    parser.add_argument("--huey-workers", type=int, default=1)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per measurement")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument(
        "--json-out", type=Path, default=None, help="also write the JSON object to this file"
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="measure nothing: print the report of a JSON file written by --json-out",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.repeat = args.repeat or (1 if quick else 5)
    args.jobs = args.jobs or (1000 if quick else 10000)
    args.enqueue_jobs = args.enqueue_jobs or (500 if quick else args.jobs)
    args.pickup_jobs = args.pickup_jobs or (50 if quick else 200)
    args.warmup = args.warmup if args.warmup is not None else (10 if quick else 20)
    args.workloads = [w for w in args.workloads.split(",") if w]
    if set(args.workloads) - set(WORKLOADS):
        parser.error(f"unknown workloads; allowed: {', '.join(WORKLOADS)}")
    if min(args.repeat, args.jobs, args.enqueue_jobs, args.pickup_jobs) < 1:
        parser.error("counts and --repeat must be positive")
    return args


def report_from(path: Path) -> int:
    """Print the report of a JSON document written by ``--json-out`` / ``--json``."""
    doc = json.loads(path.read_text())
    nan_ = nan()

    def restore(value: Any) -> Any:  # None back to NaN where a figure was not measured
        if value is None:
            return nan_
        if isinstance(value, dict):
            return {k: restore(v) for k, v in value.items()}
        if isinstance(value, list):
            return [restore(v) for v in value]
        return value

    all_systems = [System(**{**s, "workloads": tuple(s["workloads"])}) for s in doc["systems"]]
    summary = {
        "medians": restore(doc["medians"]),
        "ratios": restore(doc["ratios"]),
        "goals": restore(doc["goals"]),
    }
    context = {k: doc[k] for k in ("date", "method", "machine", "versions")}
    args = argparse.Namespace(**doc["settings"])
    print_report(summary, all_systems, context, doc["violations"], args)
    return 1 if doc["violations"] else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report is not None:
        return report_from(args.report)
    all_systems = systems(args)
    if args.systems:
        wanted = {s.strip() for s in args.systems.split(",") if s.strip()}
        unknown = wanted - {s.key for s in all_systems}
        if unknown:
            progress(f"unknown systems {sorted(unknown)}; allowed: {[s.key for s in all_systems]}")
            return 2
        all_systems = [s for s in all_systems if s.key in wanted]

    pythons: dict[str, str] = {}
    for s in all_systems:
        pythons[s.key] = str(ensure_venv(s.peer)) if s.peer else sys.executable

    with psycopg.connect(args.pg_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    machine = {**machine_description(), "postgres": row[0] if row else "?", **code_version()}
    started = dt.datetime.now(dt.UTC)
    stores = FreshStores(args.pg_url)
    results: list[dict[str, Any]] = []
    progress(
        f"bench/compare: {len(all_systems)} systems, workloads {args.workloads}, "
        f"{args.repeat} repeat(s); stores under {stores.directory} and schemas "
        f"{stores.prefix}_*"
    )
    try:
        for repeat in range(args.repeat):
            shift = repeat % len(all_systems)
            order = all_systems[shift:] + all_systems[:shift]
            for workload in args.workloads:
                for s in order:
                    if workload in s.workloads:
                        results.append(measure(s, workload, repeat, args, pythons[s.key], stores))
    finally:
        stores.close()
    machine["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    # Other work may change src/ during a long run: say so when the hash moved.
    machine["src_hash_at_end"] = code_version()["src_hash"]
    machine["minutes"] = round((dt.datetime.now(dt.UTC) - started).total_seconds() / 60, 1)

    versions: dict[str, str] = {}
    for r in results:
        if r.get("version") and r.get("system"):
            versions[r["system"]] = r["version"]
    summary = summarise(results, all_systems)
    violations = [
        f"{r['key']} {r['workload']} repeat {r['repeat'] + 1}: {v}"
        for r in results
        for v in r["violations"]
    ]
    method = (
        f"drain {args.jobs:,} no-op jobs by one worker process, enqueue {args.enqueue_jobs:,} "
        f"one per call, pickup {args.pickup_jobs} jobs {args.pickup_interval_ms:g} ms apart to an "
        f"idle worker; {args.warmup} untimed warm-up jobs each; fresh store per measurement; "
        f"median of {args.repeat} interleaved repeat(s)"
    )
    context = {
        "date": f"{started:%Y-%m-%d %H:%M} UTC",
        "method": method,
        "machine": machine,
        "versions": versions,
    }
    document = {
        "benchmark": "bench/compare",
        **context,
        "settings": dict(vars(args)),
        "systems": [s.__dict__ for s in all_systems],
        **summary,
        "violations": violations,
        "runs": results,
    }
    text = json.dumps(no_nan(document), indent=2, default=str, allow_nan=False)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print_report(summary, all_systems, context, violations, args)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
