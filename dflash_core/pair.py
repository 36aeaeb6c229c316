"""Moved to dflash_core.models.pair; this name stays for code that imports it."""

from .models.pair import *  # noqa: F403
