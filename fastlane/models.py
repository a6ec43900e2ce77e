"""Kept so that ``from fastlane.models import …`` goes on working: the models live in :mod:`fastlane.domain.models`."""

from fastlane.domain.models import *  # noqa: F403
from fastlane.domain.models import __all__  # noqa: F401
