"""Moved to dflash_core.models.loading; this name stays for code that imports it."""

from .models.loading import *  # noqa: F403
