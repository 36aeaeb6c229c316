class DFlashError(Exception):
    """A user-facing problem: one line that says what is wrong and how to fix it."""
