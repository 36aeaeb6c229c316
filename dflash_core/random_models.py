"""Moved to dflash_core.training.random_models; this name stays for imports and `python -m`."""

from .training.random_models import *  # noqa: F403
from .training.random_models import main

if __name__ == "__main__":
    main()
