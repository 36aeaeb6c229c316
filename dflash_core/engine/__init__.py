"""The engine: the DFlash cycle (`cycle`), the draft and target it drives, the policy that decides
each cycle, the records it yields. Imports nothing from loading, serving or training."""

from .cycle import OracleDraft, accepted_length, baseline_generate, dflash_generate, first_divergence

__all__ = ["accepted_length", "baseline_generate", "dflash_generate", "first_divergence", "OracleDraft"]
