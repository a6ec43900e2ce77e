"""A workflow run's graph for the console (:mod:`fastlane.console.dag`): each step in the column of
its depth, siblings one under another, an edge from each parent's right side to its child's left."""

from __future__ import annotations

from fastlane.console.dag import BOX_HEIGHT, BOX_WIDTH, COLUMN_GAP, MARGIN, ROW_GAP, layout
from fastlane.domain.workflow_definitions import parse_definition

DIAMOND = parse_definition({"name": "close", "steps": [
    {"name": "sum", "job_type": "t"},
    {"name": "mail", "job_type": "t", "after": ["sum"]},
    {"name": "report", "job_type": "t", "after": [{"step": "sum", "on": "on_failure"}]},
    {"name": "archive", "job_type": "t", "after": ["mail", "report"]},
]}, tenant="default")


def test_steps_sit_in_the_column_of_their_depth_and_edges_join_them() -> None:
    graph = layout(DIAMOND, {"sum": "succeeded", "mail": "active"})
    where = {box.name: (box.x, box.y, box.state) for box in graph.boxes}
    column = BOX_WIDTH + COLUMN_GAP
    assert where == {
        "sum": (MARGIN, MARGIN, "succeeded"),
        "mail": (MARGIN + column, MARGIN, "active"),
        "report": (MARGIN + column, MARGIN + BOX_HEIGHT + ROW_GAP, "waiting"),  # no state yet: waiting
        "archive": (MARGIN + 2 * column, MARGIN, "waiting"),
    }
    joined = {(line.x1, line.y1, line.x2, line.y2, line.condition) for line in graph.lines}
    middle = BOX_HEIGHT // 2
    assert (MARGIN + BOX_WIDTH, MARGIN + middle, MARGIN + column, MARGIN + BOX_HEIGHT + ROW_GAP + middle,
            "on_failure") in joined
    assert len(graph.lines) == 4
    assert (graph.width, graph.height) == (2 * MARGIN + 3 * BOX_WIDTH + 2 * COLUMN_GAP,
                                           2 * MARGIN + 2 * BOX_HEIGHT + ROW_GAP)
