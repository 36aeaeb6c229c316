"""How much memory this device has for a model pair, and a warning when a pair comes close to it.

On Apple silicon the GPU shares the machine's memory, and Metal recommends keeping a working set
under a limit (`mx.device_info()["max_recommended_working_set_size"]`, two thirds to three
quarters of the memory); past it the pair pages out and decoding crawls. mlx-lm warns at 90 % of that limit, and
so does this project: when a pair is about to be downloaded (estimated from its files) and when it
has been loaded (measured).
"""

import os

from .. import backend

mx = backend.mx
NEAR_LIMIT = 0.9  # the share of the working set past which loading a pair warns (as mlx-lm)
GB = 1 << 30


def device_memory() -> dict:
    """{"memory": bytes, "working_set": bytes, "source": what the numbers are}. Metal reports its
    recommended working set; CUDA its device memory; the CPU backend nothing, so the machine's RAM
    stands for both."""
    info = mx.device_info()
    if "max_recommended_working_set_size" in info:
        return {
            "memory": info.get("memory_size", info["max_recommended_working_set_size"]),
            "working_set": info["max_recommended_working_set_size"],
            "source": "Metal's recommended working set",
        }
    total = info.get("total_memory") or info.get("memory_size")
    if total:
        return {"memory": total, "working_set": total, "source": "the GPU's memory"}
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"memory": ram, "working_set": ram, "source": "the machine's RAM, CPU backend"}


def gb(nbytes: int) -> str:
    return f"{nbytes / GB:.1f} GB" if nbytes >= GB / 10 else f"{nbytes / (1 << 20):.0f} MB"


def describe() -> dict:
    """For `doctor`: the device's memory and the working set a pair should stay under."""
    m = device_memory()
    return {"memory": gb(m["memory"]), "working_set": f"{gb(m['working_set'])} ({m['source']})"}


def fit_warning(nbytes: int, what: str) -> str:
    """A warning line when `nbytes` is more than 90 % of the device's working set, else ''."""
    m = device_memory()
    if nbytes <= NEAR_LIMIT * m["working_set"]:
        return ""
    return (
        f"{what} takes {gb(nbytes)}, more than {NEAR_LIMIT:.0%} of this device's working set "
        f"({gb(m['working_set'])}, {m['source']}; {gb(m['memory'])} memory in all): it may page out "
        "and decode slowly; a 4-bit target (mlx-community) or --draft-quant 4 needs less"
    )


def loaded_bytes(config: dict, file_bytes: int) -> int:
    """About what weights of `file_bytes` on disk take once loaded. Metal and CUDA keep them as
    stored; on a CPU they are computed in float32 (backend.compute_dtype), quantized ones
    dequantized first (loading._ready)."""
    if not backend.on_cpu():
        return file_bytes
    quant = config.get("quantization") or {}
    text = config.get("text_config") or {}
    dtype = config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or text.get("dtype")
    stored = quant["bits"] / 8 if "bits" in quant else 4 if dtype == "float32" else 2
    return int(file_bytes * 4 / stored)
