"""argparse value types: a bad value is the parser's one error line, never a traceback later."""

import argparse


def whole_number(text: str) -> int:
    """Any whole number; where the valid range depends on the model, the engine checks it (--max-tokens)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None


def positive_int(text: str) -> int:
    """A size or count that must be at least 1 (tokens, layers, batch sizes, repeats)."""
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is too small: give a whole number >= 1")
    return value


def count(text: str) -> int:
    """A count where 0 means none (held-out sequences, added layers, evaluations)."""
    value = whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give a whole number >= 0")
    return value


def probability(text: str) -> float:
    """A probability or share, 0 .. 1 (--min-confidence, --distill, --chat-fraction)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number: give a probability such as 0.4") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1: give a probability such as 0.4")
    return value


def temperature(text: str) -> float:
    """A sampling temperature: 0 is greedy decoding, above 0 sampling."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a number: give a temperature such as 0.7 (0: greedy)"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give a temperature >= 0 (0: greedy)")
    return value


def top_p(text: str) -> float:
    """Nucleus sampling's mass, 0 < p <= 1 (1 keeps every token)."""
    value = probability(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 keeps no token: give a top-p above 0, up to 1 (1 keeps all)")
    return value
