"""The async client SDK: one :class:`Client` per daemon and tenant, over one channel.

:mod:`~fastlane.client.client` holds the calls (jobs, runs, workflows, audit, cluster, tokens,
quotas), :mod:`~fastlane.client.connection` the channel they share, :mod:`~fastlane.client.convert`
the replies only a client reads, :mod:`~fastlane.client.bulk_calls` the calls made part after part
(bulk actions, backfills), :mod:`~fastlane.client.options` the options of a job, and
:mod:`~fastlane.client.payloads` how a payload becomes bytes.
"""

from fastlane.client.client import Client
from fastlane.client.options import JobOptions
from fastlane.client.payloads import encode_payload

__all__ = ["Client", "JobOptions", "encode_payload"]
