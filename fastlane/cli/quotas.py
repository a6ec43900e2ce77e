"""``fastlane quotas``: what a tenant may take of the cluster, and an admin's overrides.

``get`` shows the quotas in force for a tenant (its override over the nodes' defaults, which are
``fastlane serve --quota-…``) and the override itself; ``set`` replaces a tenant's override
(admin tokens only); ``--reset`` removes it.
"""

from __future__ import annotations

import argparse
from typing import Any

from fastlane.cli.arguments import client_flags, json_flag
from fastlane.cli.output import print_json, print_table
from fastlane.cli.remote import run_remote
from fastlane.client import Client
from fastlane.domain.quotas import TenantQuota
from fastlane.errors import InvalidArgument

FIELDS = ("max_jobs", "job_creations_per_second", "max_waiting_runs")


def register(commands: Any) -> None:
    """Add ``quotas`` and its subcommands to the top-level subparsers."""
    quotas = commands.add_parser("quotas", help="show and set tenants' quotas",
                                 description="Show a tenant's quotas; set or reset its override (admin tokens).")
    verbs = quotas.add_subparsers(dest="verb", required=True, metavar="VERB")

    get = verbs.add_parser("get", parents=[client_flags()], help="the quotas in force for a tenant, and its override")
    json_flag(get)
    get.set_defaults(handler=get_quota, command_parser=get)

    put = verbs.add_parser("set", parents=[client_flags(tenant=False)],
                           help="replace a tenant's override; flags left out fall back to the nodes' defaults")
    put.add_argument("--tenant", required=True, help="the tenant whose quotas to set")
    put.add_argument("--max-jobs", metavar="N", type=int, help="jobs the tenant may have at once")
    put.add_argument("--job-creations-per-second", metavar="R", type=float,
                     help="job creations per second, on each node")
    put.add_argument("--max-waiting-runs", metavar="N", type=int,
                     help="runs due and not yet taken by a worker, beyond which the API adds no more")
    put.add_argument("--reset", action="store_true", help="remove the override: the tenant gets the defaults")
    json_flag(put)
    put.set_defaults(handler=set_quota, command_parser=put)


def get_quota(args: argparse.Namespace) -> int:
    async def show(client: Client) -> int:
        in_force, override = await client.get_quota(args.tenant)
        _print(args, args.tenant or "(the token's tenant)", in_force, override)
        return 0

    return run_remote(args, show)


def set_quota(args: argparse.Namespace) -> int:
    override = TenantQuota(max_jobs=args.max_jobs, job_creations_per_second=args.job_creations_per_second,
                           max_waiting_runs=args.max_waiting_runs)
    if args.reset and override != TenantQuota():
        raise InvalidArgument("--reset", "removes the whole override: give it alone, without limits")
    if not args.reset and override == TenantQuota():
        raise InvalidArgument("--max-jobs", "give at least one limit to set, or --reset")
    override.validated()

    async def put(client: Client) -> int:
        in_force, stored = await client.set_quota(args.tenant, None if args.reset else override)
        _print(args, args.tenant, in_force, stored)
        return 0

    return run_remote(args, put)


def _print(args: argparse.Namespace, tenant: str, in_force: TenantQuota, override: TenantQuota) -> None:
    if args.json:
        print_json({"tenant": tenant, "in_force": _view(in_force), "override": _view(override)})
        return
    print(f"tenant {tenant}")
    print_table(("QUOTA", "IN FORCE", "OVERRIDE"),
                [(name, _shown(getattr(in_force, name), "unlimited"), _shown(getattr(override, name), "default"))
                 for name in FIELDS])


def _view(quota: TenantQuota) -> dict[str, Any]:
    return {name: getattr(quota, name) for name in FIELDS}


def _shown(value: float | None, unset: str) -> str:
    return unset if value is None else f"{value:,g}" if isinstance(value, float) else f"{value:,}"
