"""Worker start-up (issue 27 item 2): spawn -> ready, spawn -> first claim, imports, idle RSS.

For each repeat and backend, in alternation:

- ``floor``: the same interpreter spawned with ``-c pass`` until it exits (what no Python
  program can beat on this machine at this moment: the ratio below is against it);
- ``ready``: ``taskward worker`` spawned over a store holding one queued no-op task; measured
  from just before the spawn to the task's ``running`` fact (the worker's first claim: it has
  imported, opened and checked the store, registered itself and claimed), by the store's
  clock on the same machine;
- ``rss``: the resident memory of that worker once it is idle (after the task completed);
- ``imports``: one ``python -X importtime`` of the worker's command path, reporting the
  modules imported and whether any web-stack module (FastAPI, Starlette, uvicorn, Jinja2) is
  among them -- the worker path must import none.

    .venv/bin/python bench/startup.py --repeat 10 [--backends sqlite,postgres]

Source without cached bytecode is compiled at every start (``PYTHONDONTWRITEBYTECODE``, an
editable install): the benchmark compiles ``src/`` first, as ``pip install`` does for a wheel.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    DEFAULT_PG_URL,
    REPO_ROOT,
    Stores,
    WorkerProcess,
    admit_tasks,
    machine_description,
    median,
    progress,
    raw_connection,
    raw_value,
    read_rss_mb,
    render_table,
)
from bench.tasks import NOOP_KIND

WEB_STACK = ("fastapi", "starlette", "uvicorn", "jinja2", "itsdangerous", "pydantic_settings")


def floor_once() -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.monotonic() - start


def ready_once(stores: Stores, backend: str, log_dir: Path) -> dict[str, float]:
    store = stores.create(backend)
    try:
        (task_id,) = admit_tasks(store, NOOP_KIND, {}, 1, key_prefix="startup")
        worker = WorkerProcess(
            store,
            concurrency=8,
            burst=False,
            log_dir=log_dir,
            extra_args=["--heartbeat-interval", "0.2"],
        )
        worker.start()
        try:
            with raw_connection(store) as conn:
                deadline = time.monotonic() + 60.0
                claimed_at = completed_at = None
                while time.monotonic() < deadline:
                    claimed_at = raw_value(
                        conn,
                        "SELECT MIN(created_at) FROM status_transitions "
                        "WHERE entity_id = ? AND status = 'running'",
                        (task_id,),
                    )
                    completed_at = raw_value(
                        conn,
                        "SELECT MIN(created_at) FROM status_transitions "
                        "WHERE entity_id = ? AND status = 'completed'",
                        (task_id,),
                    )
                    if completed_at is not None or worker.poll() is not None:
                        break
                    time.sleep(0.005)
            if claimed_at is None or completed_at is None:
                raise RuntimeError(f"the worker did not run the task (exit {worker.poll()})")
            time.sleep(0.5)  # idle now: the task is done and its next claim pass found nothing
            rss = read_rss_mb(worker.pid)
        finally:
            worker.stop()
        return {
            "ready_s": float(claimed_at) - worker.spawned_at,
            "first_completion_s": float(completed_at) - worker.spawned_at,
            "rss_mb": rss.get("VmRSS", float("nan")),
        }
    finally:
        stores.remove(store)


def imports_once() -> dict[str, Any]:
    """The worker command's imports, as ``python -X importtime`` reports them."""
    code = (
        "import sys, taskward.cli.main, taskward.cli.worker_cmd, taskward.runtime\n"
        "import json; print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    )
    modules = json.loads(out.stdout)
    total_us = 0
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and not parts[2].startswith("  ") and parts[1].strip().isdigit():
            total_us += int(parts[1])  # top-level imports' cumulative times
    web = sorted({m.split(".")[0] for m in modules} & set(WEB_STACK))
    return {
        "modules": len(modules),
        "taskward_modules": sum(1 for m in modules if m.split(".")[0] == "taskward"),
        "import_s": total_us / 1e6,
        "web_stack": web,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    parser.add_argument(
        "--no-bytecode",
        action="store_true",
        help="Remove src/'s compiled bytecode and run the children with PYTHONDONTWRITEBYTECODE=1 "
        "(an editable install before scripts/ compiled it: every start compiles every module).",
    )
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]

    if args.no_bytecode:
        for cache in (REPO_ROOT / "src").rglob("__pycache__"):
            shutil.rmtree(cache)
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # inherited by every child
    else:
        compileall.compile_dir(str(REPO_ROOT / "src"), quiet=1)
    stores = Stores(args.pg_url, None, "startup")
    results: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
    floors: list[float] = []
    imports: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="taskward-startup-") as tmp:
            for i in range(args.repeat):
                floors.append(floor_once())
                imports.append(imports_once())
                for backend in backends if i % 2 == 0 else list(reversed(backends)):
                    one = ready_once(stores, backend, Path(tmp))
                    results[backend].append(one)
                    progress(
                        f"[{i + 1}/{args.repeat}] {backend:8} ready {one['ready_s'] * 1000:6.0f} ms"
                        f"  first completion {one['first_completion_s'] * 1000:6.0f} ms"
                        f"  idle RSS {one['rss_mb']:5.1f} MiB  (floor {floors[-1] * 1000:.0f} ms)"
                    )
    finally:
        stores.close()

    floor = median(floors)
    rows = []
    summary: dict[str, Any] = {"machine": machine_description(), "floor_s": floor}
    for backend, runs in results.items():
        ready = [r["ready_s"] for r in runs]
        first = [r["first_completion_s"] for r in runs]
        rss = [r["rss_mb"] for r in runs]
        summary[backend] = {"ready_s": ready, "first_completion_s": first, "rss_mb": rss}
        rows.append(
            [
                backend,
                f"{median(ready) * 1000:.0f} ({min(ready) * 1000:.0f}-{max(ready) * 1000:.0f})",
                f"{median(first) * 1000:.0f}",
                f"{median(ready) / floor:.1f}x",
                f"{median(rss):.1f} (max {max(rss):.1f})",
            ]
        )
    imp = imports[-1]
    summary["imports"] = {**imp, "import_s": [i["import_s"] for i in imports]}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        render_table(
            [
                "backend",
                "ready ms median (range)",
                "first completion ms",
                "/ floor",
                "idle RSS MiB",
            ],
            rows,
        )
    )
    print(
        f"  floor: `python -c pass` {floor * 1000:.0f} ms median; worker path imports "
        f"{imp['modules']} modules ({imp['taskward_modules']} taskward), "
        f"{median(summary['imports']['import_s']) * 1000:.0f} ms by -X importtime (median); "
        f"web stack imported: {', '.join(imp['web_stack']) or 'none'}"
    )
    print(f"  load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
