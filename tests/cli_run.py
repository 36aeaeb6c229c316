"""`python -m dflash_core ...` in a child process, as a user runs it from the repository: for the
tests that check what the command line prints and returns."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def dflash_cli(*args, env: dict = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """The finished run, its stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", "dflash_core", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )
