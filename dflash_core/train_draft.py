"""Moved to dflash_core.training (train_draft, draft_data, draft_blocks, decoding); this name stays for imports."""

from .training.decoding import *  # noqa: F403
from .training.draft_blocks import *  # noqa: F403
from .training.draft_data import *  # noqa: F403
from .training.train_draft import *  # noqa: F403
