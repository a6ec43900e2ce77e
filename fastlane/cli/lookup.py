"""Finding the job or run a person means: by its id, a job by its name, either by a unique start of its id."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastlane.client import Client
from fastlane.domain import validation
from fastlane.domain.models import Job
from fastlane.domain.records import Page
from fastlane.errors import FastlaneError, InvalidArgument, RemoteNotFound

T = TypeVar("T")

MIN_ID_PREFIX = 4  # shorter prefixes would match too many ids to be worth a look-up


async def by_id_prefix(
    reference: str, kind: str, listed: Callable[[str], Awaitable[Page[T]]], id_of: Callable[[T], str], hint: str,
) -> str:
    """The one id that starts with ``reference`` (``listed(prefix)`` asks the node for up to two);
    FastlaneError naming what was looked for when there is none, or more than one."""
    if len(reference) >= MIN_ID_PREFIX:
        found = [id_of(item) for item in (await listed(reference)).items]
        if len(found) == 1:
            return found[0]
        if found:
            raise FastlaneError(f"more than one {kind} id starts with {reference!r}: give more of it")
    looked = ("nor one whose id starts so" if len(reference) >= MIN_ID_PREFIX
              else f"a start of an id needs {MIN_ID_PREFIX} characters or more")
    raise FastlaneError(f"no {kind} with the id{' or name' if kind == 'job' else ''} {reference!r} in this tenant "
                        f"({looked}; {hint})")


async def resolve_job(client: Client, reference: str) -> Job:
    """The job ``reference`` names: by its id, else its name (unique in a tenant), else a unique
    start of its id (see :func:`by_id_prefix`)."""
    try:
        return await client.get_job(reference)
    except RemoteNotFound:
        pass
    try:
        validation.name("name", reference)
    except InvalidArgument:
        pass  # not a name either
    else:
        page = await client.list_jobs(name=reference, page_size=1)
        if page.items:
            return await client.get_job(page.items[0].job_id)  # with its payload, as by id
    job_id = await by_id_prefix(reference, "job", lambda prefix: client.list_jobs(id_prefix=prefix, page_size=2),
                                lambda job: job.job_id, "`fastlane jobs list` shows them")
    return await client.get_job(job_id)


async def resolve_workflow_run(client: Client, reference: str) -> str:
    """The id of the workflow run ``reference`` names: its id, or a unique prefix of it."""
    try:
        return (await client.get_workflow_run(reference))[0].workflow_run_id
    except RemoteNotFound:
        return await by_id_prefix(reference, "workflow run",
                                  lambda prefix: client.list_workflow_runs(id_prefix=prefix, page_size=2),
                                  lambda run: run.workflow_run_id, "`fastlane workflows runs NAME` shows them")


async def resolve_run(client: Client, reference: str) -> str:
    """The id of the run ``reference`` names: its id, or a unique prefix of it (as the demo and
    a narrow terminal show them)."""
    try:
        return (await client.get_run(reference))[0].run_id
    except RemoteNotFound:
        return await by_id_prefix(reference, "run", lambda prefix: client.list_runs(id_prefix=prefix, page_size=2),
                                  lambda run: run.run_id, "`fastlane runs list` shows them")
