"""A workflow run's graph for the console, laid out on the server: each step a box in the column of
its depth (the longest path from a step with no parent), its edges drawn from parent to child,
coloured by the step's state. Rendered as SVG attributes (the console's CSP admits its own
stylesheet, not inline styles), so no script draws it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fastlane.domain.workflow_definitions import topological
from fastlane.domain.workflows import WorkflowSpec

BOX_WIDTH, BOX_HEIGHT = 150, 36
COLUMN_GAP, ROW_GAP, MARGIN = 60, 18, 10


@dataclass(frozen=True, slots=True)
class Box:
    name: str
    state: str
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Line:
    x1: int
    y1: int
    x2: int
    y2: int
    condition: str  # on_success, on_failure, always: how the child waits for the parent


@dataclass(frozen=True, slots=True)
class Graph:
    boxes: list[Box]
    lines: list[Line]
    width: int
    height: int
    box_width: int = BOX_WIDTH
    box_height: int = BOX_HEIGHT


def layout(spec: WorkflowSpec, states: Mapping[str, str]) -> Graph:
    """Boxes by depth and definition order, and a line per edge (right side of the parent to the
    left side of the child)."""
    depth: dict[str, int] = {}
    for step in topological(spec):
        depth[step.name] = 1 + max((depth[edge.parent] for edge in step.after), default=-1)
    rows: dict[int, int] = {}
    boxes: dict[str, Box] = {}
    for step in spec.steps:
        column = depth[step.name]
        row = rows.get(column, 0)
        rows[column] = row + 1
        boxes[step.name] = Box(step.name, states.get(step.name, "waiting"),
                               x=MARGIN + column * (BOX_WIDTH + COLUMN_GAP), y=MARGIN + row * (BOX_HEIGHT + ROW_GAP))
    lines = [Line(boxes[edge.parent].x + BOX_WIDTH, boxes[edge.parent].y + BOX_HEIGHT // 2,
                  boxes[step.name].x, boxes[step.name].y + BOX_HEIGHT // 2, edge.condition.value)
             for step in spec.steps for edge in step.after]
    columns, most_rows = 1 + max(depth.values(), default=0), max(rows.values(), default=1)
    return Graph(list(boxes.values()), lines, width=2 * MARGIN + columns * BOX_WIDTH + (columns - 1) * COLUMN_GAP,
                 height=2 * MARGIN + most_rows * BOX_HEIGHT + (most_rows - 1) * ROW_GAP)
