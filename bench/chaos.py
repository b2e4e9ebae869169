"""The long forms of the fault scenarios (issue 8), on demand: ``tests/faults`` with
``TASKWARD_CHAOS=1`` and only its ``chaos``-marked cases.

What runs (each case ends with the invariant checker; see docs/faults.md):

- 20,000 no-op tasks drained by six competing worker processes (zero double claims), and
  20,000 drained by four while a supervisor SIGKILLs a random one every half second for a
  minute (nothing lost, no double terminal, orphans recovered within lease + reaper interval);
- a crash at the 2nd and 3rd commit of claim, adapter run, summary and complete, five tasks at
  once (the short form crashes at the 1st commit of every boundary);
- poison tasks (four copies each, attempt ceiling 5) among 3,000 healthy ones;
- 5,000 cancellations racing completion.

This is a wrapper: the cases are pytest tests, run on both backends unless ``--backends`` says
otherwise. It takes tens of minutes. The exit status is pytest's.

Usage: .venv/bin/python bench/chaos.py [--backends sqlite,postgres] [--short] [-- PYTEST ARGS]
  --short   also run the short forms (what the suite runs), for a before/after comparison
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--short", action="store_true", help="also run the short forms")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"sqlite", "postgres"}
    if unknown or not backends:
        parser.error(f"--backends: expected sqlite and/or postgres, got {args.backends!r}")
    selection = " or ".join(backends)
    marks = "slow" if args.short else "chaos"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/faults",
        "-m",
        marks,
        "-k",
        selection,
        "-s",
        "-ra",
        "--durations=0",
        *args.pytest_args,
    ]
    env = {**os.environ, "TASKWARD_CHAOS": "1"}
    print("+ TASKWARD_CHAOS=1 " + " ".join(command[1:]), file=sys.stderr, flush=True)
    return subprocess.call(command, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
