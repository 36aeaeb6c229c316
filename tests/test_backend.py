"""Backend choices made before MLX starts: the compute dtype override and the CUDA attention path."""

import os
import subprocess
import sys
import time

import mlx.core as mx
import pytest
from cli_run import dflash_cli

from dflash_core import backend
from dflash_core.models.loading import load_pair


# MLX switches set before MLX starts, each of which the user's own setting overrides:
# cuDNN attention (every speculative cycle has a new key length; cuDNN would build a plan for
# each one) and TF32 matmuls (a many-row verify in TF32 and a one-row step in float32 can round
# a near-tie apart)
@pytest.mark.parametrize("name", ["MLX_CUDA_USE_CUDNN_SDPA", "MLX_ENABLE_TF32"])
def test_an_mlx_switch_is_off_unless_the_user_chose(name):
    assert os.environ[name] == "0"
    code = f"import os, dflash_core; print(os.environ['{name}'])"
    env = {**os.environ, name: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_dtype_override_sets_the_compute_dtype(monkeypatch, random_dirs):
    target, draft = random_dirs["qwen3"]
    monkeypatch.setenv("DFLASH_DTYPE", "bfloat16")
    pair = load_pair(str(target), str(draft))
    assert pair.model.layers[0].self_attn.q_proj.weight.dtype == mx.bfloat16
    assert pair.draft.fc.weight.dtype == mx.bfloat16
    monkeypatch.delenv("DFLASH_DTYPE")
    assert backend.compute_dtype() == mx.float32  # this CPU's default


def test_a_gpu_computes_the_default_pair_in_the_dtype_measured_for_it(monkeypatch, random_dirs):
    """On a GPU a shipped pair may compute in another dtype than its weights' own
    (registry.GPU_DTYPES: SmolLM2's float16 GGUF in float32); other models keep theirs, and
    DFLASH_DTYPE still wins. Checked on this CPU by taking the GPU's branch."""
    from dflash_core.models.registry import gpu_dtype

    assert gpu_dtype("smollm2-135m") == "float32"
    assert gpu_dtype("HuggingFaceTB/SmolLM2-135M-Instruct") == "float32"  # any copy of its weights
    assert gpu_dtype("Qwen/Qwen3-4B") is None
    monkeypatch.setattr(backend, "on_cpu", lambda: False)
    monkeypatch.delenv("DFLASH_DTYPE", raising=False)
    assert backend.compute_dtype("float32") == mx.float32 and backend.compute_dtype() is None
    assert backend.describe()["dtype"] == "the weights' own; smollm2-135m: float32"  # what `doctor` says
    pair = load_pair()
    assert pair.compute_dtype == mx.float32
    assert pair.target.inner.norm.weight.dtype == mx.float32  # stored float16
    assert pair.target.inner.embed_tokens.scales.dtype == mx.float32  # still quantized: only a CPU dequantizes
    assert pair.draft.fc.weight.dtype == mx.float32
    target, draft = random_dirs["qwen3"]
    stored = load_pair(str(target), str(draft))
    assert stored.compute_dtype is None
    monkeypatch.setenv("DFLASH_DTYPE", "bfloat16")
    assert load_pair().target.inner.norm.weight.dtype == mx.bfloat16


@pytest.mark.slow
def test_bad_dtype_is_one_error_line(random_dirs):
    target, draft = random_dirs["qwen3"]
    env = {**os.environ, "DFLASH_DTYPE": "float64"}
    out = dflash_cli("generate", "--model", target, "--draft", draft, "--prompt", "x", "--max-tokens", "4", env=env)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("error:") and "DFLASH_DTYPE=float64" in lines[-1], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.skipif(
    not backend._PER_ENGINE_THREADS, reason="needs the system OpenBLAS and no OPENBLAS_NUM_THREADS of the user's"
)
def test_each_engine_runs_on_the_blas_thread_count_measured_fastest(random_pairs, monkeypatch):
    """Each engine's BLAS thread count is measured once per pair (one vs all cores, the faster
    for this model) and set when each run starts."""
    from dataclasses import replace

    pair = replace(random_pairs["qwen3"], blas_threads={})
    ids = pair.encode("def f(x):")
    threads = backend._OPENBLAS.openblas_get_num_threads
    events = pair.dflash(ids, 8)
    backend._OPENBLAS.openblas_set_num_threads(7)
    next(events)  # the setting follows the run, not the call that created it
    assert pair.blas_threads["dflash"] in backend.thread_choices()
    assert threads() == pair.blas_threads["dflash"]
    list(events)
    list(pair.baseline(ids, 8))
    assert threads() == pair.blas_threads["baseline"] in backend.thread_choices()
    monkeypatch.setattr(type(pair), "_fastest_threads", lambda *a: pytest.fail("measured twice"))
    backend._OPENBLAS.openblas_set_num_threads(7)
    *_, run = pair.dflash(ids, 8)
    assert threads() == pair.blas_threads["dflash"] and run.tokens


@pytest.mark.slow
def test_the_faster_thread_count_is_chosen(random_pairs, monkeypatch):
    """The choice follows the measurement, whichever count it favours."""
    from dataclasses import replace

    from dflash_core.models import pair as pair_module

    real = pair_module.dflash_generate
    for fast in backend.thread_choices():

        def slowed_unless_fast(*args, **kwargs):
            if backend._OPENBLAS.openblas_get_num_threads() != fast:  # noqa: B023 (this pass's choice)
                time.sleep(0.3)  # far above the noise of a loaded machine
            return real(*args, **kwargs)

        monkeypatch.setattr(pair_module, "dflash_generate", slowed_unless_fast)
        pair = replace(random_pairs["qwen3"], blas_threads={})
        list(pair.dflash(pair.encode("x"), 4))
        assert pair.blas_threads["dflash"] == fast
