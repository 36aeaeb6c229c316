"""The engine: the DFlash cycle (`cycle`), the draft and target it drives, the policy that decides
each cycle, the records it yields. Imports nothing from loading, serving or training."""

from .cycle import accepted_length, baseline_generate, dflash_generate, first_divergence, oracle_draft

__all__ = ["accepted_length", "baseline_generate", "dflash_generate", "first_divergence", "oracle_draft"]
