"""DFlash speculative decoding on MLX: engine, loaders, benchmark, trainer, CLI (no UI)."""

from . import backend  # noqa: F401  (loads the system BLAS before MLX on Linux)
