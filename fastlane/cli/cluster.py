"""``fastlane cluster``: the nodes of a cluster, its workers, and which node owns each shard.

The tables show what an operator checks first (is every node live and eligible, which workers
serve which job types, are the shards spread); ``--shards`` lists every shard with its lease,
``--json`` has every field, including heap size, ready runs and instants.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from fastlane.cli.arguments import client_flags, json_flag
from fastlane.cli.output import print_json, print_table
from fastlane.cli.remote import run_remote
from fastlane.cli.views import cluster_view
from fastlane.client import Client


def register(commands: Any) -> None:
    """Add ``cluster`` to the top-level subparsers."""
    remote = client_flags()
    cluster = commands.add_parser(
        "cluster",
        parents=[remote],
        help="show the nodes, workers and shard owners of the cluster",
        description="Show the nodes of the cluster, the workers connected to the node that answers (their job "
        "types, free credits and attempts in flight), and how many shards each node owns.",
    )
    cluster.add_argument("--shards", action="store_true",
                         help="list every shard with its owner, fencing token and lease (default: a count per node)")
    json_flag(cluster)
    cluster.set_defaults(handler=show_cluster, command_parser=cluster)


def show_cluster(args: argparse.Namespace) -> int:
    async def show(client: Client) -> int:
        view = cluster_view(await client.cluster())
        if args.json:
            print_json(view)
            return 0
        print(f"database time: {view['database_time'] or '-'}")
        print()
        print_table(
            ("NODE_ID", "ADDRESS", "LIVE", "ELIGIBLE", "READY", "SHARDS", "WORKERS", "CLOCK_OFFSET_MS",
             "HEARTBEAT_AGE_S", "NOTE"),
            [
                (
                    node["node_id"],
                    node["address"],
                    node["live"],
                    node["eligible"],
                    node["ready"],
                    node["shards_owned"],
                    node["workers_connected"],
                    f"{node['clock_offset_ms']:.1f}",
                    _one_decimal(node["heartbeat_age_seconds"]),
                    node["note"],
                )
                for node in view["nodes"]
            ],
        )
        print()
        if view["workers"]:
            print_table(
                ("WORKER", "TENANT", "JOB_TYPES", "FREE_CREDITS", "IN_FLIGHT", "NODE"),
                [(worker["worker_id"], worker["tenant"] or "(all)", ",".join(worker["job_types"]), worker["credits"],
                  worker["in_flight"], worker["node_id"]) for worker in view["workers"]],
            )
        else:
            print("no worker connected to the node that answered")
        print()
        if args.shards:
            print_table(
                ("SHARD", "OWNER", "TOKEN", "LEASE_EXPIRES_IN_S"),
                [
                    (shard["shard_id"], shard["owner"], shard["token"], _one_decimal(shard["lease_expires_in_seconds"]))
                    for shard in view["shards"]
                ],
            )
            return 0
        # A lease that ran out is no one's until a node takes the shard: counted as lapsed.
        owners = Counter(shard["owner"] if (shard["lease_expires_in_seconds"] or 0) >= 0 else "(lapsed)"
                         for shard in view["shards"])
        unowned = owners.pop(None, 0)
        summary = ", ".join(f"{owner}: {count}" for owner, count in sorted(owners.items()))
        print(f"shards: {len(view['shards'])} ({summary or 'none owned'}{f'; unowned: {unowned}' if unowned else ''})"
              " — --shards lists each")
        return 0

    return run_remote(args, show)


def _one_decimal(seconds: float | None) -> str | None:
    return None if seconds is None else f"{seconds:.1f}"
