"""Dependencies (DESIGN.md R21) from the terminal, on both backends: ``taskward task submit
--depends-on`` and ``taskward task tree`` as real subprocesses, and the tree's walk and drawing
(``cli.tree_cmd``) over a real store."""

from __future__ import annotations

from typing import Any

from taskward import get_task
from taskward.cli.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK
from taskward.cli.tree_cmd import LINE_WIDTH, dependency_tree, short_id, tree_lines
from taskward.store import StateDB
from tests.acceptance.test_cli import Taskward, assert_no_traceback
from tests.acceptance.test_cli import taskward as taskward
from tests.integration.helpers import move, submit

ENV = {"TASKWARD_COMMAND_ALLOWLIST": "true"}
TRUE = ("command", "--args", '{"argv": ["true"]}')


def cli_submit(taskward: Taskward, key: str, *extra: str) -> str:
    run = taskward("task", "submit", *TRUE, "--key", key, *extra, env=ENV)
    assert run.code == EXIT_OK, run.stderr
    return run.stdout.strip()


def test_depends_on_is_repeatable_and_comma_separated(taskward: Taskward) -> None:
    a, b, c = (cli_submit(taskward, k) for k in ("a", "b", "c"))
    d = cli_submit(taskward, "d", "--depends-on", f"{a},{b}", "--depends-on", c)
    shown = taskward("task", "show", d, "--json", env=ENV).json()
    assert (shown["status"], shown["status_reason_code"]) == (
        "waiting_dependency",
        "dependencies_pending",
    )
    tree = taskward("task", "tree", d, "--json", env=ENV)
    assert tree.code == EXIT_OK, tree.stderr
    assert sorted(p["id"] for p in tree.json()["parents"]) == sorted([a, b, c])
    # The same key and the same ids in another order and spelling: the same task.
    again = cli_submit(taskward, "d", "--depends-on", f" {c} ,{b}", "--depends-on", a)
    assert again == d


def test_missing_dependencies_exit_2_naming_them_and_store_nothing(taskward: Taskward) -> None:
    a = cli_submit(taskward, "a")
    run = taskward("task", "submit", *TRUE, "--depends-on", f"{a},nope", "--json", env=ENV)
    assert run.code == EXIT_BAD_INPUT, run.stderr
    assert "depends_on" in run.stderr and "nope" in run.stderr
    assert_no_traceback(run)
    assert len(taskward("task", "list", "--json", env=ENV).json()["tasks"]) == 1


def test_tree_draws_parents_and_children_and_unknown_ids_exit_1(taskward: Taskward) -> None:
    a = cli_submit(taskward, "root-a")
    b = cli_submit(taskward, "mid-b", "--depends-on", a)
    c = cli_submit(taskward, "leaf-c", "--depends-on", b)
    run = taskward("task", "tree", b, env=ENV)
    assert run.code == EXIT_OK, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith(b) and "waiting_dependency" in lines[0]
    assert lines[1] == "depends on:"
    assert short_id(a) in lines[2] and "queued" in lines[2] and "root-a" in lines[2]
    assert lines[3] == "needed by:"
    assert short_id(c) in lines[4] and "leaf-c" in lines[4]
    assert all(len(line) <= LINE_WIDTH for line in lines)
    missing = taskward("task", "tree", "no-such-task", env=ENV)
    assert missing.code == EXIT_FAILURE and "not found" in missing.stderr
    assert_no_traceback(missing)
    as_json = taskward("task", "tree", "no-such-task", "--json", env=ENV)
    assert as_json.code == EXIT_FAILURE and '"TaskNotFound"' in as_json.stderr
    bad_depth = taskward("task", "tree", b, "--depth", "0", env=ENV)
    assert bad_depth.code == EXIT_BAD_INPUT


async def test_a_diamond_is_expanded_once_and_depth_is_counted(db: StateDB) -> None:
    """root <- left, right <- join (a diamond), then a chain under join."""
    root = await submit(db, idempotency_key="root")
    left = await submit(db, idempotency_key="left", depends_on=[root])
    right = await submit(db, idempotency_key="right", depends_on=[root])
    join = await submit(db, idempotency_key="join", depends_on=[left, right])
    chain = [join]
    for i in range(3):
        chain.append(await submit(db, idempotency_key=f"chain-{i}", depends_on=[chain[-1]]))

    tree = await dependency_tree(db, join, depth=2)
    parents = {p["idempotency_key"]: p for p in tree["parents"]}
    assert set(parents) == {"left", "right"}
    first, second = (parents["left"], parents["right"])
    if left > right:  # listed in id order: the first reached expands, the second repeats
        first, second = second, first
    assert [p["id"] for p in first["parents"]] == [root]
    assert second["parents"] == [{**second["parents"][0], "repeated": True}]
    [child] = tree["children"]
    assert child["id"] == chain[1] and [g["id"] for g in child["children"]] == [chain[2]]
    grandchild = child["children"][0]
    assert grandchild["children"] == [] and grandchild["more_children"] == 1  # past --depth
    assert tree["truncated"] is False

    lines = tree_lines(tree)
    text = "\n".join(lines)
    assert "(see above)" in text and "1 more (raise --depth)" in text
    assert all(len(line) <= LINE_WIDTH for line in lines)


async def test_the_walk_stops_at_its_node_budget(db: StateDB) -> None:
    root = await submit(db)
    for _ in range(5):
        await submit(db, depends_on=[root])
    tree = await dependency_tree(db, root, max_nodes=3)
    assert len(tree["children"]) == 3 and tree["truncated"] is True
    assert tree_lines(tree)[-1].startswith("… more not shown")


def test_lines_fit_80_columns_whatever_the_key_and_kind() -> None:
    node: dict[str, Any] = {
        "id": "01a244f2-f1c7-7e04-b269-a30e6c74ae13",
        "action_kind": "a.very.long.module.path:and_a_long_function_name",
        "status": "waiting_dependency",
        "idempotency_key": "k" * 300,
    }
    deep: dict[str, Any] = {**node, "parents": []}
    for _ in range(15):
        deep = {**node, "parents": [deep]}
    tree = {"task": node, "parents": [deep], "children": [], "truncated": False}
    lines = tree_lines(tree)
    assert len(lines) == 1 + 1 + 16 + 1  # the task, "depends on:", 16 nodes, "needed by"
    assert all(len(line) <= LINE_WIDTH for line in lines), max(lines, key=len)
    assert short_id(node["id"]) == "a30e6c74ae13" and short_id("plain") == "plain"


async def test_a_completed_parent_shows_in_the_tree(db: StateDB) -> None:
    parent = await submit(db)
    await move(db, parent, "queued", "running", "completed")
    child = await submit(db, depends_on=[parent])
    assert (await get_task(db, child))["status"] == "queued"
    tree = await dependency_tree(db, child)
    assert [(p["id"], p["status"]) for p in tree["parents"]] == [(parent, "completed")]
