"""HTML for the playground's panes, from the engine's events. Pure functions: no Gradio, no MLX.

gr.HTML sets innerHTML unsanitised, so every piece of model or user text goes through `esc`
(html.escape with quotes) before it is placed in markup or in an attribute.

Split by pane: text (escaping, plain text, messages), tokens (the DFlash pane), stats (the figures
panes), inspector (the cycle inspector). The names below are the ones the page uses.
"""

from .inspector import explain, inspector_html
from .stats import (
    PLAIN_STEPS_HINT,
    dflash_extra,
    divergence_detail,
    lossless_html,
    policy_summary,
    race_html,
    speedup_html,
    stats_html,
)
from .text import REPLACEMENT, Pieces, error_html, esc, info_html, plain_text_html, show_text, warning_html
from .tokens import LEGEND, PLAIN_STEP_WORDS, cycle_spans, dflash_tokens_html

__all__ = [
    "LEGEND",
    "PLAIN_STEPS_HINT",
    "PLAIN_STEP_WORDS",
    "REPLACEMENT",
    "Pieces",
    "cycle_spans",
    "dflash_extra",
    "dflash_tokens_html",
    "divergence_detail",
    "error_html",
    "esc",
    "explain",
    "info_html",
    "inspector_html",
    "lossless_html",
    "plain_text_html",
    "policy_summary",
    "race_html",
    "show_text",
    "speedup_html",
    "stats_html",
    "warning_html",
]
