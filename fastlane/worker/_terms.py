"""What a node said of itself in its Welcome: which parts of the protocol this connection may use.

A worker talks to nodes of older releases too, so each newer message or field is used only where
the node's Welcome says it reads it; a connection starts (and ends) with none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastlane._proto import workers_pb2 as pb


@dataclass(frozen=True)
class NodeTerms:
    credits_with_results: bool = False  # the node reads Results.credits: no CreditGrant beside results
    prompt_results: bool = False  # the node wants a result after a quiet spell at once
    takes_drain: bool = False  # the node reads Drain, so a stopping worker can take its credits back

    @classmethod
    def of(cls, welcome: pb.Welcome) -> NodeTerms:
        return cls(credits_with_results=welcome.takes_credits_with_results,
                   prompt_results=welcome.prompt_results, takes_drain=welcome.takes_drain)
