"""Measured figures live in docs/benchmarks.md, not in the code's comments (issue 24, item 3).

A comment keeps the reason for a choice and points to docs/benchmarks.md's "Figures that justified
design choices"; the figure, its method and its date stay on that page, where they can be dated
and re-measured. Applied migrations are never edited, so their comments are left as written.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "taskward"
DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
ANCHOR = "docs/benchmarks.md#figures-that-justified-design-choices"

# A timing in microseconds, a before -> after of one, a speed-up in percent or tasks a second.
FIGURE = re.compile(
    r"\d(?:[\d.,]*\d)? ?(?:µs|us)\b"
    r"|\d ?-> ?\d[\d.,]* ?(?:µs|us|ms)\b"
    r"|[+-]?\d[\d.]* ?% (?:faster|slower|tasks/s)"
    r"|tasks/s [+-]\d"
    r"|\d ?ms (?:a|per) (?:call|task|tick|pass|claim)"
)


def _sources() -> list[Path]:
    files = [*SRC.rglob("*.py"), *SRC.rglob("*.sql")]
    return sorted(p for p in files if "migrations" not in p.parts)


def test_no_comment_in_src_reports_a_measured_figure() -> None:
    found = [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in _sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FIGURE.search(line)
    ]
    assert found == [], "move the figure to docs/benchmarks.md and point there:\n" + "\n".join(
        found
    )


def test_the_pointers_name_a_section_that_exists() -> None:
    pointing = [p for p in _sources() if ANCHOR in p.read_text(encoding="utf-8")]
    assert pointing, "the comments point to the figures' section"
    assert "\n## Figures that justified design choices\n" in DOC.read_text(encoding="utf-8")
