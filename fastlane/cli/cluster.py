"""``fastlane cluster``: the nodes of a cluster and which node owns each shard."""

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
            ("NODE_ID", "ADDRESS", "READY", "SHARDS", "WORKERS", "HEAP", "READY_RUNS", "CLOCK_OFFSET_MS"),
            [
                (
                    node["node_id"],
                    node["address"],
                    node["ready"],
                    node["shards_owned"],
                    node["workers_connected"],
                    node["heap_size"],
                    node["ready_runs"],
                    f"{node['clock_offset_ms']:.1f}",
                )
                for node in view["nodes"]
            ],
        )
        print()
        print_table(
            ("SHARD", "OWNER", "TOKEN", "LEASE_EXPIRES_AT"),
            [
                (shard["shard_id"], shard["owner"], shard["token"], shard["lease_expires_at"])
                for shard in view["shards"]
            ],
        )
        return 0

    return run_remote(args, show)
