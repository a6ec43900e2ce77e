"""``fastlane cluster``: the nodes of a cluster and which node owns each shard.

The table shows what an operator checks first (is every node live and eligible, are the shards
spread, are leases being renewed); ``--json`` has every field, including heap size, ready runs and
instants.
"""

from __future__ import annotations

import argparse
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
        help="show the nodes and shard owners of the cluster",
        description="Show the nodes of the cluster and which node owns each shard.",
    )
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
        print_table(
            ("SHARD", "OWNER", "TOKEN", "LEASE_EXPIRES_IN_S"),
            [
                (shard["shard_id"], shard["owner"], shard["token"], _one_decimal(shard["lease_expires_in_seconds"]))
                for shard in view["shards"]
            ],
        )
        return 0

    return run_remote(args, show)


def _one_decimal(seconds: float | None) -> str | None:
    return None if seconds is None else f"{seconds:.1f}"
