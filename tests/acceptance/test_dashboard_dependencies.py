"""Dependencies (DESIGN.md R21) on the dashboard, over ASGI on SQLite and PostgreSQL: a task's
page lists what it depends on and what needs it with their states, says why a waiting task
waits, and links to the workflow view, whose server-rendered SVG draws the connected graph in
layers (bounded, escaped, readable without the drawing)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import httpx

from taskward.dashboard import graphpages, graphviews
from taskward.http import HttpConfig
from taskward.store import StateDB
from tests.acceptance.test_dashboard_retry import READER, TOKENS, Client
from tests.acceptance.test_dashboard_retry import client as client
from tests.acceptance.test_dashboard_retry import make_client as make_client
from tests.acceptance.test_dashboard_scheduling import field_href, field_text, twin_field
from tests.integration.helpers import move, submit

SVG = "{http://www.w3.org/2000/svg}"


def svg_of(page: str) -> ET.Element:
    """The workflow view's ``<svg>`` element, parsed as XML (so it is well-formed too)."""
    found = re.search(r'<svg class="dag".*?</svg>', page, re.S)
    assert found, page
    return ET.fromstring(found.group(0))


def nodes_of(svg: ET.Element) -> dict[str, dict[str, Any]]:
    """Each drawn task by id: its status, link, ``<title>`` and box."""
    out = {}
    for a in svg.iter(f"{SVG}a"):
        rect = a.find(f"{SVG}rect")
        title = a.find(f"{SVG}title")
        assert rect is not None and title is not None
        out[a.attrib["data-task-id"]] = {
            "status": a.attrib["data-status"],
            "href": a.attrib["href"],
            "title": title.text,
            "x": int(rect.attrib["x"]),
            "y": int(rect.attrib["y"]),
            "cls": a.attrib["class"],
        }
    return out


async def chain_and_fan_in(db: StateDB) -> dict[str, str]:
    """a <- b <- c (a chain); c, d, e <- f (a fan-in); a completed."""
    a = await submit(db, idempotency_key="a")
    await move(db, a, "queued", "running", "completed")
    b = await submit(db, idempotency_key="b", depends_on=[a])
    c = await submit(db, idempotency_key="c", depends_on=[b])
    d = await submit(db, idempotency_key="d")
    e = await submit(db, idempotency_key="e")
    f = await submit(db, idempotency_key="f", depends_on=[c, d, e])
    return {"a": a, "b": b, "c": c, "d": d, "e": e, "f": f}


def table_ids(region: dict[str, Any]) -> list[str]:
    return [line[0]["text"] for line in region["rows"]]


async def test_the_task_page_lists_parents_and_children_and_why_it_waits(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    t = await chain_and_fan_in(db)
    page = (await client.get(f"/tasks/{t['f']}")).text
    assert '<div data-region="dependencies" class="region region-toggle">' in page
    placement = field_text(page, "placement") or ""
    assert placement.startswith("waiting for 3 of 3 dependencies: ")
    assert f"{graphviews.short_id(t['c'])} (waiting_dependency)" in placement
    assert f"{graphviews.short_id(t['d'])} (queued)" in placement
    assert field_href(page, "placement") == f"/tasks/{t['f']}/graph"
    assert f'<a href="/tasks/{t["f"]}/graph">workflow view</a>' in page

    regions = (await client.get(f"/ui/data/tasks/{t['f']}")).json()["regions"]
    assert sorted(table_ids(regions["depends-on"])) == sorted([t["c"], t["d"], t["e"]])
    assert regions["needed-by"]["rows"] == []
    row = next(r for r in regions["depends-on"]["rows"] if r[0]["text"] == t["d"])
    assert row[0]["href"] == f"/tasks/{t['d']}"
    assert row[1] == {"text": "queued", "cls": "status status-queued"}
    assert row[3]["text"] == "d"

    # b: one completed parent, one waiting child; it is queued, so no "waiting for".
    regions = (await client.get(f"/ui/data/tasks/{t['b']}")).json()["regions"]
    assert table_ids(regions["depends-on"]) == [t["a"]]
    assert regions["depends-on"]["rows"][0][1]["text"] == "completed"
    assert table_ids(regions["needed-by"]) == [t["c"]]
    placed = twin_field(regions, "placement")
    assert placed is not None and not placed["text"].startswith("waiting for")
    # Once its dependencies end, the twin keeps the lists current (the page polls it).
    await move(db, t["d"], "queued", "cancelled")
    regions = (await client.get(f"/ui/data/tasks/{t['f']}")).json()["regions"]
    states = {line[0]["text"]: line[1]["text"] for line in regions["depends-on"]["rows"]}
    assert states[t["d"]] == "cancelled"


async def test_a_task_without_links_hides_the_section(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    alone = await submit(db)
    page = (await client.get(f"/tasks/{alone}")).text
    assert '<div data-region="dependencies" class="region region-toggle" hidden>' in page
    assert "/graph" not in page
    regions = (await client.get(f"/ui/data/tasks/{alone}")).json()["regions"]
    assert regions["dependencies"] == {"kind": "toggle", "visible": False}
    assert regions["graph-link"]["href"] is None


async def test_the_workflow_view_draws_the_connected_graph_in_layers(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    t = await chain_and_fan_in(db)
    other = await submit(db, idempotency_key="unrelated")
    r = await client.get(f"/tasks/{t['b']}/graph")
    assert r.status_code == 200, r.text
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    svg = svg_of(r.text)
    nodes = nodes_of(svg)
    assert set(nodes) == set(t.values())  # from b, the whole graph; never the unrelated task
    assert other not in r.text
    assert len(list(svg.iter(f"{SVG}path"))) - 1 == 5  # five links, plus the arrowhead's path
    column = {name: nodes[task_id]["x"] for name, task_id in t.items()}
    # x is the depth from the roots (a, d, e), one column per layer.
    assert column["a"] == column["d"] == column["e"] < column["b"] < column["c"] < column["f"]
    assert nodes[t["a"]]["status"] == "completed" and "dag-completed" in nodes[t["a"]]["cls"]
    assert nodes[t["f"]]["status"] == "waiting_dependency"
    assert "dag-focus" in nodes[t["b"]]["cls"]
    assert nodes[t["c"]]["href"] == f"/tasks/{t['c']}"
    assert nodes[t["c"]]["title"] == f"task {t['c']}: command, waiting_dependency, key c"
    legend = re.findall(r'<rect class="dag-swatch dag-(\w+)"', r.text)
    assert legend == ["queued", "waiting_dependency", "completed"]
    title = svg.find(f"{SVG}title")
    assert title is not None and title.text == f"Dependency graph of task {t['b']}"
    assert svg.attrib["role"] == "img"
    # The same tasks as a table, by layer.
    assert re.search(r"<td>2</td><td class=\"mono\"><a href=\"/tasks/" + t["c"], r.text)


async def test_the_workflow_view_is_bounded_and_escapes_what_it_draws(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    root = await submit(db, idempotency_key="<script>alert(1)</script>")
    for i in range(6):
        await submit(db, idempotency_key=f"fan-{i}", depends_on=[root])
    graph = await graphpages.read_graph(db, root, max_nodes=4)
    assert len(graph.nodes) == 4 and graph.truncated
    assert all(parent == root for _, parent in graph.edges) and len(graph.edges) == 3
    view = graphviews.graph_view(graph)
    assert len(view["nodes"]) == 4 and view["truncated"] is True

    page = (await client.get(f"/tasks/{root}/graph")).text
    assert "<script>alert" not in page
    assert "key &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert len(nodes_of(svg_of(page))) == 7
    assert "the graph has more" not in page


async def test_the_workflow_view_of_an_unknown_task_is_a_404_and_needs_read(
    make_client: Client, db: StateDB
) -> None:
    client = make_client()
    assert (await client.get("/tasks/nope/graph")).status_code == 404
    assert (await client.get(f"/tasks/{'x' * 300}/graph")).status_code == 404
    task_id = await submit(db)
    locked = make_client(HttpConfig(tokens=TOKENS))
    r = await locked.get(f"/tasks/{task_id}/graph")
    assert r.status_code == 303 and r.headers["location"].startswith("/login?next=")
    assert (await locked.post("/login", data={"token": READER, "next": "/"})).status_code == 303
    assert (await locked.get(f"/tasks/{task_id}/graph")).status_code == 200


def test_layers_are_the_longest_chain_above_a_task() -> None:
    graph = graphviews.Graph(
        focus="d",
        nodes={n: {"id": n, "status": "queued", "action_kind": "k"} for n in "abcd"},
        edges={("b", "a"), ("c", "b"), ("d", "a"), ("d", "c")},
    )
    assert graphviews.layers_of(graph) == {"a": 0, "b": 1, "c": 2, "d": 3}
    view = graphviews.graph_view(graph)
    assert view["width"] == 2 * graphviews.MARGIN + 4 * graphviews.NODE_W + 3 * graphviews.GAP_X
    assert [n["id"] for n in sorted(view["nodes"], key=lambda n: n["x"])] == list("abcd")
    # d's link to a spans three layers: it runs through a waypoint in each layer between, in a
    # row of its own (two rows tall), never behind b and c.
    by_id = {n["id"]: n for n in view["nodes"]}
    assert by_id["b"]["y"] == by_id["c"]["y"]
    assert view["height"] == 2 * graphviews.MARGIN + 2 * graphviews.NODE_H + graphviews.GAP_Y
    [long_edge] = [e for e in view["edges"] if e["label"].startswith("d depends on a")]
    through = re.findall(r" L(\d+),(\d+)", long_edge["d"])
    assert [int(x) for x, _ in through] == [by_id[n]["x"] + graphviews.NODE_W for n in ("b", "c")]
    rows = {graphviews.MARGIN, graphviews.MARGIN + graphviews.NODE_H + graphviews.GAP_Y}
    [other_row] = rows - {by_id["b"]["y"]}
    assert {int(y) for _, y in through} == {other_row + graphviews.NODE_H // 2}
