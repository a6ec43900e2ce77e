"""Kept so that ``from fastlane.effects import apply_once`` goes on working: see :mod:`fastlane.worker.effects`."""

from fastlane.worker.effects import *  # noqa: F403
from fastlane.worker.effects import __all__  # noqa: F401
