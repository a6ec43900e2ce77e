"""``fastlane workflows``: define workflows (DAGs of steps), start them, follow and steer their runs.

``create`` reads a definition (a JSON file, see the README's "Workflows") and stores it as the
workflow's next version; ``list`` and ``get`` show definitions; ``trigger`` starts a run now;
``runs`` lists a workflow's runs; ``show`` draws one run's graph with each step's state (``--dot``:
as Graphviz); ``cancel`` and ``resume`` steer a run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from fastlane.cli.arguments import add_json_flags, client_flags, json_document, json_flag
from fastlane.cli.lookup import resolve_workflow_run
from fastlane.cli.output import print_fields, print_json, print_table
from fastlane.cli.remote import run_remote
from fastlane.client import Client
from fastlane.domain.workflow_definitions import topological
from fastlane.domain.workflows import EdgeCondition, StepView, Workflow, WorkflowRun
from fastlane.errors import InvalidArgument
from fastlane.rpc.wire import rfc3339


def register(commands: Any) -> None:
    """Add ``workflows`` and its subcommands to the top-level subparsers."""
    workflows = commands.add_parser(
        "workflows", help="define workflows (DAGs of steps) and follow their runs",
        description="Define workflows: steps (job types) whose runs wait for other runs, started by a "
                    "schedule or a trigger.")
    verbs = workflows.add_subparsers(dest="verb", required=True, metavar="VERB")

    create = verbs.add_parser("create", parents=[client_flags()], help="store a definition as the next version")
    create.add_argument("file", metavar="FILE", help="the definition, a JSON file ('-': standard input)")
    json_flag(create)
    create.set_defaults(handler=create_workflow, command_parser=create)

    listing = verbs.add_parser("list", parents=[client_flags()], help="the workflows, latest version of each")
    listing.add_argument("--limit", type=int, default=100, metavar="N", help="at most N (1..1000; default 100)")
    json_flag(listing)
    listing.set_defaults(handler=list_workflows, command_parser=listing)

    get = verbs.add_parser("get", parents=[client_flags()], help="a workflow's definition")
    get.add_argument("name", metavar="NAME", help="the workflow's name")
    get.add_argument("--version", type=int, default=0, metavar="N", help="this version (default: the latest)")
    json_flag(get)
    get.set_defaults(handler=get_workflow, command_parser=get)

    trigger = verbs.add_parser("trigger", parents=[client_flags()], help="start a run of a workflow now")
    trigger.add_argument("name", metavar="NAME", help="the workflow's name; the run follows its latest version")
    add_json_flags(trigger, "--input", "the run's input (default: null)", '{"day": "2026-06-01"}')
    json_flag(trigger)
    trigger.set_defaults(handler=trigger_workflow, command_parser=trigger)

    runs = verbs.add_parser("runs", parents=[client_flags()], help="a workflow's runs, newest first")
    runs.add_argument("name", metavar="NAME", help="the workflow's name")
    runs.add_argument("--limit", type=int, default=20, metavar="N", help="at most N (1..1000; default 20)")
    json_flag(runs)
    runs.set_defaults(handler=list_runs, command_parser=runs)

    show = verbs.add_parser("show", parents=[client_flags()], help="a workflow run's graph, with each step's state")
    show.add_argument("workflow_run_id", metavar="WORKFLOW_RUN_ID",
                      help="the workflow run's id, as `workflows trigger` and `workflows runs` print it, or a unique start of it")
    show.add_argument("--dot", action="store_true", help="print the graph in Graphviz's dot language")
    json_flag(show)
    show.set_defaults(handler=show_run, command_parser=show)

    for verb, helptext in (("cancel", "cancel a workflow run: queued steps never start, running ones are stopped"),
                           ("resume", "run a failed or cancelled workflow run on: failed steps again, not the "
                                      "succeeded ones")):
        steer = verbs.add_parser(verb, parents=[client_flags()], help=helptext)
        steer.add_argument("workflow_run_id", metavar="WORKFLOW_RUN_ID",
                           help="the workflow run's id, as `workflows trigger` and `workflows runs` print it, or a unique start of it")
        json_flag(steer)
        steer.set_defaults(handler=steer_run, command_parser=steer)


def create_workflow(args: argparse.Namespace) -> int:
    raw = sys.stdin.read() if args.file == "-" else _read(args.file)

    async def create(client: Client) -> int:
        workflow, created = await client.create_workflow(raw)
        if args.json:
            print_json({**workflow_view(workflow), "created": created})
        else:
            what = "created" if created else "unchanged (the same definition is the latest version)"
            print(f"workflow {workflow.name} version {workflow.version}: {what}")
        return 0

    return run_remote(args, create)


def list_workflows(args: argparse.Namespace) -> int:
    async def show(client: Client) -> int:
        page = await client.list_workflows(page_size=args.limit)
        if args.json:
            print_json([workflow_view(workflow) for workflow in page.items])
            return 0
        print_table(("NAME", "VERSION", "STEPS", "SCHEDULE", "CREATED"),
                    [(w.name, w.version, len(w.spec.steps), _schedule(w), w.created_at) for w in page.items])
        return 0

    return run_remote(args, show)


def get_workflow(args: argparse.Namespace) -> int:
    async def show(client: Client) -> int:
        workflow = await client.get_workflow(args.name, args.version)
        if args.json:
            print_json(workflow_view(workflow))
            return 0
        print_fields([("name", workflow.name), ("version", workflow.version), ("job", workflow.job_id),
                      ("schedule", _schedule(workflow)), ("failure policy", workflow.spec.failure_policy.value),
                      ("created", workflow.created_at)])
        print()
        print_table(("STEP", "JOB TYPE", "AFTER", "FOR EACH"),
                    [(step.name, step.job_type, _edges(step.after), step.for_each) for step in topological(workflow.spec)])
        return 0

    return run_remote(args, show)


def trigger_workflow(args: argparse.Namespace) -> int:
    given = json_document(args.input, args.input_file, flag="--input", file_flag="--input-file")
    value = None if given is None else orjson.loads(given)

    async def trigger(client: Client) -> int:
        run = await client.trigger_workflow(args.name, value)
        if args.json:
            print_json(run_view(run))
        else:
            print(f"workflow run {run.workflow_run_id} of {run.workflow_name} version {run.version}: {run.state.value}")
        return 0

    return run_remote(args, trigger)


def list_runs(args: argparse.Namespace) -> int:
    async def show(client: Client) -> int:
        page = await client.list_workflow_runs(args.name, page_size=args.limit)
        if args.json:
            print_json([run_view(run) for run in page.items])
            return 0
        print_table(("WORKFLOW RUN", "VERSION", "STATE", "CREATED", "FINISHED", "ERROR"),
                    [(r.workflow_run_id, r.version, r.state.value, r.created_at, r.finished_at, r.error)
                     for r in page.items])
        return 0

    return run_remote(args, show)


def show_run(args: argparse.Namespace) -> int:
    async def show(client: Client) -> int:
        run, workflow, steps = await client.get_workflow_run(await resolve_workflow_run(client, args.workflow_run_id))
        if args.dot:
            print(dot_graph(run, workflow, steps))
        elif args.json:
            print_json({**run_view(run), "steps": [step_view(step) for step in steps]})
        else:
            print(text_graph(run, workflow, steps))
        return 0

    return run_remote(args, show)


def steer_run(args: argparse.Namespace) -> int:
    async def steer(client: Client) -> int:
        if args.verb == "cancel":
            run = await client.cancel_workflow_run(await resolve_workflow_run(client, args.workflow_run_id))
        else:
            run = await client.resume_workflow_run(await resolve_workflow_run(client, args.workflow_run_id))
        if args.json:
            print_json(run_view(run))
        else:
            print(f"workflow run {run.workflow_run_id}: {run.state.value}")
        return 0

    return run_remote(args, steer)


# -- views ----------------------------------------------------------------------------------------

_MARKS = {"waiting": " ", "active": "~", "succeeded": "✓", "failed": "✗", "skipped": "-", "cancelled": "⊘"}
_COLOURS = {"waiting": "white", "active": "lightblue", "succeeded": "palegreen", "failed": "salmon",
            "skipped": "lightgrey", "cancelled": "khaki"}


def text_graph(run: WorkflowRun, workflow: Workflow, steps: list[StepView]) -> str:
    """One line per step, parents first: its state, its edges in, its runs and error."""
    by_name = {step.name: step for step in steps}
    lines = [f"workflow run {run.workflow_run_id}: {workflow.name} version {workflow.version}, {run.state.value}"
             + (f" ({run.error})" if run.error else "")]
    width = max(len(step.name) for step in workflow.spec.steps)
    for spec in topological(workflow.spec):
        view = by_name[spec.name]
        counts = _run_counts(view)
        edges = f"  after {_edges(spec.after)}" if spec.after else ""
        fan = f"  for each of {spec.for_each}" if spec.for_each else ""
        error = f"  {view.error}" if view.error else ""
        lines.append(f"  [{_MARKS[view.state.value]}] {spec.name.ljust(width)}  {view.state.value:<9}"
                     f"{counts}{edges}{fan}{error}{_returned(view)}")
    return "\n".join(lines)


def dot_graph(run: WorkflowRun, workflow: Workflow, steps: list[StepView]) -> str:
    """The run's graph in Graphviz's dot language: steps filled by state, edges labelled by condition."""
    by_name = {step.name: step for step in steps}
    lines = [f"digraph {_quoted(workflow.name)} {{",
             f"  label={_quoted(f'{workflow.name} v{workflow.version} run {run.workflow_run_id}: {run.state.value}')};",
             "  node [shape=box, style=\"rounded,filled\"];"]
    for spec in workflow.spec.steps:
        view = by_name[spec.name]
        label = f"{spec.name}\\n{view.state.value}{_run_counts(view)}"
        lines.append(f"  {_quoted(spec.name)} [label=\"{label}\", fillcolor={_COLOURS[view.state.value]}];")
        for edge in spec.after:
            style = "" if edge.condition is EdgeCondition.ON_SUCCESS else f" [label={_quoted(edge.condition.value)}]"
            lines.append(f"  {_quoted(edge.parent)} -> {_quoted(spec.name)}{style};")
    lines.append("}")
    return "\n".join(lines)


def _run_counts(view: StepView) -> str:
    if view.items <= 1:
        return ""
    done = sum(1 for state in view.run_states if state.is_final)
    return f" ({done}/{view.items} items ended)"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _edges(edges: Any) -> str:
    return ", ".join(edge.parent if edge.condition is EdgeCondition.ON_SUCCESS
                     else f"{edge.parent} ({edge.condition.value})" for edge in edges) or "-"


def _schedule(workflow: Workflow) -> str:
    schedule = workflow.spec.schedule
    if schedule is None:
        return "triggers only"
    if schedule.cron is not None:
        return f"cron {schedule.cron} ({schedule.timezone})"
    if schedule.every is not None:
        return f"every {schedule.every.total_seconds():g} s"
    return f"at {rfc3339(schedule.at)}" if schedule.at is not None else "now"


def workflow_view(workflow: Workflow) -> dict[str, Any]:
    return {"workflow_id": workflow.workflow_id, "name": workflow.name, "version": workflow.version,
            "job_id": workflow.job_id, "created_at": rfc3339(workflow.created_at),
            "definition": orjson.loads(workflow.definition)}


def run_view(run: WorkflowRun) -> dict[str, Any]:
    return {"workflow_run_id": run.workflow_run_id, "workflow": run.workflow_name, "version": run.version,
            "state": run.state.value, "input": orjson.loads(run.input) if run.input else None,
            "error": run.error, "created_at": rfc3339(run.created_at), "finished_at": rfc3339(run.finished_at)}


def _returned(view: StepView, most: int = 60) -> str:
    """What a step's one run returned, on one line (a fan-out's: how many returned something)."""
    outputs = [output for output in view.outputs if output]
    if not outputs:
        return ""
    if len(view.outputs) > 1:
        return f"  → {len(outputs)} outputs (--json has them)"
    text = outputs[0].decode(errors="replace")
    return f"  → {text if len(text) <= most else text[:most - 1] + '…'}"


def step_view(step: StepView) -> dict[str, Any]:
    return {"name": step.name, "state": step.state.value, "run_ids": list(step.run_ids),
            "run_states": [state.value for state in step.run_states], "error": step.error,
            "outputs": [orjson.loads(output) if output else None for output in step.outputs]}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as error:
        raise InvalidArgument("FILE", f"cannot read {path}: {error.strerror}") from None
