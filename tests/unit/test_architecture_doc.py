"""docs/architecture.md "Layers" draws the import-linter contract, row for row (issue 24 item 4).

The contract (``[tool.importlinter]`` in pyproject.toml, checked by ``lint-imports``) is the truth
about which module may import which; the table is how a reader learns it. This test keeps the two
equal: the same rows in the same order, each row the same modules, each under the same coarse
layer (the ``# name`` comment lines of the contract's ``layers`` list), and together every module
at the top of the package. A module added, moved or renamed in one and not the other fails here.
"""

from __future__ import annotations

import pkgutil
import re
import tomllib
from pathlib import Path

import taskward

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CONTRACT = "layers point down"

Rows = list[tuple[str, frozenset[str]]]


def _contract() -> dict[str, object]:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    (contract,) = (c for c in config["contracts"] if c["name"] == CONTRACT)
    return contract


def contract_rows() -> Rows:
    """The contract's layers, each with the coarse layer named by the comment line above it."""
    layers = _contract()["layers"]
    assert isinstance(layers, list)
    # tomllib drops comments: read the coarse names from the list's text, the rows from tomllib.
    text = PYPROJECT.read_text(encoding="utf-8")
    start = text.index(f'name = "{CONTRACT}"')
    body = text[text.index("layers = [", start) : text.index("\n]", start)]
    coarse, names = "", []
    for line in body.splitlines()[1:]:
        line = line.strip()
        if line.startswith("#"):
            coarse = line.lstrip("# ").strip()
        elif line.startswith('"'):
            names.append(coarse)
    assert len(names) == len(layers), "every layer is one quoted line of the list"
    rows = []
    for name, layer in zip(names, layers, strict=True):
        assert ":" not in layer, f"{layer!r}: siblings that import each other (justify, then adapt)"
        rows.append((name, frozenset(part.strip() for part in layer.split("|"))))
    return rows


def doc_rows() -> Rows:
    """The rows of the table in docs/architecture.md "## Layers"; a blank layer cell continues the
    layer above."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("\n## Layers\n") :]
    section = section[: section.index("\n## ", 1)]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert lines[0].split("|")[1:3] == [" layer ", " modules "], lines[0]
    rows, coarse = [], ""
    for line in lines[2:]:  # past the header and the |---| line
        cells = line.split("|")
        coarse = cells[1].strip() or coarse
        modules = frozenset(name.rstrip("/") for name in re.findall(r"`([^`]+)`", cells[2]))
        rows.append((coarse, modules))
    return rows


def package_children() -> set[str]:
    return {info.name for info in pkgutil.iter_modules(taskward.__path__)}


def test_the_doc_draws_the_contract_row_for_row() -> None:
    assert doc_rows() == contract_rows()


def test_the_coarse_layers_are_the_six_of_the_design() -> None:
    names = list(dict.fromkeys(name for name, _ in contract_rows()))
    assert names == [
        "bindings", "runtime and host", "services", "transitions", "store port", "core",
    ]  # fmt: skip


def test_the_contract_places_every_module_of_the_package() -> None:
    contract = _contract()
    assert contract["containers"] == ["taskward"]
    assert contract["exhaustive"] is True
    assert "exhaustive_ignores" not in contract
    placed = [module for _, row in contract_rows() for module in row]
    assert len(placed) == len(set(placed)), "a module in two rows"
    assert set(placed) == package_children()


def test_the_doc_names_every_module_of_the_packages_it_draws() -> None:
    """The paragraphs under the table draw ``transitions/``, ``claims/``, ``maintenance/`` and
    ``host/`` module by module: a module added to one of them and not to its paragraph fails
    here."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    named = {name.rstrip("/") for name in re.findall(r"`([a-z_/]+)`", text)}
    for package in ("transitions", "claims", "maintenance", "host"):
        module = __import__(f"taskward.{package}", fromlist=["__path__"])
        for info in pkgutil.iter_modules(module.__path__):
            assert info.name in named or f"{package}/{info.name}" in named, (package, info.name)
