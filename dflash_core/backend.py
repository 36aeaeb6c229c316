"""Pick the MLX device and BLAS before anything else touches MLX.

On Linux CPU the mlx wheel links a reference BLAS; loading the system OpenBLAS first (global
symbols) makes float32 matmuls 8-13x faster. Import this module before `mlx.core` anywhere.
"""

import ctypes
import ctypes.util
import os
import sys

BLAS = "bundled reference BLAS"
_OPENBLAS = None  # the loaded library, whose thread count each engine sets (blas_threads_for)
_USER_THREADS = "OPENBLAS_NUM_THREADS" in os.environ
if sys.platform.startswith("linux") and "mlx.core" not in sys.modules:
    # OpenBLAS reads this when it loads: set it first (a user's own setting wins)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas")):
        if not name:
            continue
        try:
            _OPENBLAS = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            BLAS = f"system OpenBLAS ({name})"
            break
        except OSError:
            pass
_PER_ENGINE_THREADS = _OPENBLAS is not None and not _USER_THREADS and hasattr(_OPENBLAS, "openblas_set_num_threads")


def thread_choices() -> list:
    """The BLAS thread counts an engine may run on (one, all cores), when this process can set
    them: the system OpenBLAS is loaded and the user did not fix OPENBLAS_NUM_THREADS."""
    return sorted({1, os.cpu_count() or 1}) if _PER_ENGINE_THREADS else []


def set_blas_threads(n: int):
    _OPENBLAS.openblas_set_num_threads(n)


def blas_threads() -> int:
    """The BLAS threads in force now (0 where this process does not set them)."""
    return _OPENBLAS.openblas_get_num_threads() if _PER_ENGINE_THREADS else 0


def default_min_confidence(cpu: bool = None) -> float:
    """The draft confidence below which proposals are not verified (policy.confident_prefix), on
    a CPU or not (None: this process's device).
    On a CPU each verified row costs time, and proposals the draft gives under 20% are rarely
    accepted. With the shipped SmolLM2 pair on 2 cores (3 repeats side by side, block 8): 0.2 and
    0.3 read the same (1.44x / 1.49x median, 1.62x / 1.61x overall). On a GPU all go: on the H200
    0.2 gained inside the noise (0.95x against 0.91x median over 40 requests), and a verify of
    fewer rows runs other float32 kernels there, which rounded one near-tie apart from plain
    greedy decoding."""
    return 0.2 if (on_cpu() if cpu is None else cpu) else 0.0


def draft_vocab_pays() -> bool:
    """Whether the draft proposes from its own vocabulary (draft_vocab.json, Target.draft_head)
    rather than the whole one. On a CPU the draft's LM head over B-1 positions costs more than its
    layers: with the SmolLM2 draft on 2 cores (block 16), 72 -> 32 ms a draft step at 8,192 of
    49,152 tokens, benchmark 1.29x -> 1.61x. On a GPU the head is nearly free and a smaller vocabulary
    only loses proposals (H200: 2.77 -> 2.69 tokens per cycle, the same speed)."""
    return on_cpu()


# MLX's CUDA backend runs multi-row attention through cuDNN and builds a cuDNN plan for every new
# (query, key) shape. A speculative cycle's key length is new every cycle (the cache grows by the
# accepted tokens), so each verify and draft forward paid a plan build (~tens of ms, more than
# the whole cycle). MLX's own attention ops have no per-shape cost. (The variable's name changed
# spelling across MLX versions; both are set.)
for _name in ("MLX_CUDA_USE_CUDNN_SDPA", "MLX_CUDA_USE_CUDNN_SPDA"):
    os.environ.setdefault(_name, "0")
# MLX runs float32 matmuls of two or more rows in TF32 where the hardware has it (NVIDIA tensor
# cores, Apple M5), while a one-row product stays full float32. A verify is a matmul of many rows
# and a plain step one row, so their logits differ in the 4th digit and a near-tie can pick another
# token: on the H200, gemma4_text's random pair parted from plain decoding at a top-2 gap of 0.004
# and matched it with TF32 off. Lossless comes first; the user can still set MLX_ENABLE_TF32=1.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import mlx.core as mx  # noqa: E402


def on_cpu() -> bool:
    return mx.default_device().type == mx.cpu


DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def compute_dtype(gpu_default: str = None):
    """float32 on CPU (bf16/f16 matmuls skip BLAS there); on a GPU `gpu_default` (a shipped pair's,
    registry.gpu_dtype) or else the weights' own dtype (None); DFLASH_DTYPE wins over both
    (float32 on a GPU keeps batched verify and one-token decoding from disagreeing in the last bits
    of 16-bit logits)."""
    name = os.environ.get("DFLASH_DTYPE")
    if name:
        if name not in DTYPES:
            from .errors import DFlashError

            raise DFlashError(f"DFLASH_DTYPE={name} is not one of {', '.join(DTYPES)}")
        return DTYPES[name]
    if on_cpu():
        return mx.float32
    return DTYPES[gpu_default] if gpu_default else None


def describe() -> dict:
    import mlx_lm

    from .models.registry import GPU_DTYPES

    info = {
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "blas": BLAS if on_cpu() else "n/a (GPU backend)",
        "blas_threads": "measured per model and engine (1 or all cores)"
        if _PER_ENGINE_THREADS
        else os.environ.get("OPENBLAS_NUM_THREADS", "n/a"),
        "dtype": str(compute_dtype() or "the weights' own" + "".join(f"; {p}: {d}" for p, d in GPU_DTYPES.items())),
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
