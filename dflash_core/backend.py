"""Pick the MLX device and BLAS before anything else touches MLX.

On Linux CPU the mlx wheel links a reference BLAS; loading the system OpenBLAS first (global
symbols) makes float32 matmuls 8-13x faster. Import this module before `mlx.core` anywhere.
"""
import ctypes
import ctypes.util
import os
import sys

BLAS = "bundled reference BLAS"
if sys.platform.startswith("linux") and "mlx.core" not in sys.modules:
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas")):
        if not name:
            continue
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            BLAS = f"system OpenBLAS ({name})"
            break
        except OSError:
            pass
    # One BLAS thread per MLX worker thread: the machines this runs on have 2 cores and
    # MLX already runs its own CPU stream thread.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import mlx.core as mx  # noqa: E402


def on_cpu() -> bool:
    return mx.default_device().type == mx.cpu


def compute_dtype():
    """float32 on CPU (bf16/f16 matmuls skip BLAS there); the weights' own dtype on GPU."""
    return mx.float32 if on_cpu() else None


def describe() -> dict:
    import mlx_lm

    info = {
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "blas": BLAS if on_cpu() else "n/a (GPU backend)",
        "metal": mx.metal.is_available(),
    }
    try:
        info["cuda"] = mx.cuda.is_available()
    except AttributeError:
        info["cuda"] = False
    from huggingface_hub import constants

    info["hf_cache"] = constants.HF_HUB_CACHE
    info["hf_offline"] = bool(constants.HF_HUB_OFFLINE)
    return info
