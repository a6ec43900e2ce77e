"""Which fastlane this is: ``fastlane --version`` and a node's ``fastlane_build_info``."""

from __future__ import annotations

import importlib.metadata


def installed_version() -> str:
    """This fastlane's version, as installed (pyproject.toml's), or ``unknown`` from a bare source tree."""
    try:
        return importlib.metadata.version("fastlane")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
