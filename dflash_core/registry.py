"""Moved to dflash_core.models.registry; this name stays for code that imports it."""

from .models.registry import *  # noqa: F403
