"""A llama-architecture GGUF file as an mlx-lm model directory, converted once into a cache.

MLX reads GGUF itself (`mx.load(..., return_metadata=True)`): Q4_0 / Q4_1 / Q8_0 tensors arrive as
MLX's affine-quantized triples (`weight` packed uint32, `scales`, `biases`; groups of 32), F16 / F32
tensors as plain arrays. Those are written unchanged under mlx-lm's llama names, with a config that
tells mlx-lm each quantized layer's bits, and a `tokenizer.json` built from the GGUF's vocabulary
and merges. llama.cpp's converter permutes the rows of q and k for its interleaved rotary layout;
they are permuted back here, so the directory is a plain Hugging Face-layout llama.
"""

import hashlib
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path

import mlx.core as mx

from ..errors import DFlashError

GROUP_SIZE = 32  # MLX's GGUF reader quantizes every supported type in groups of 32
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# tokenizer.ggml.pre -> how the text is split before BPE (llama.cpp's names for these schemes)
DIGITS_THEN_BYTES = ("smollm", "starcoder", "refact")
BYTES_ONLY = ("gpt-2", "gpt2", "default")


def cache_root() -> Path:
    return Path(os.environ.get("DFLASH_CACHE", Path.home() / ".cache" / "dflash")).expanduser()


def converted(path: Path, log=print) -> Path:
    """The mlx-lm directory for this GGUF file, converted on first use. Keyed by the file's
    content, so an edited or replaced file converts again."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    out = cache_root() / "gguf" / f"{path.stem}-{digest.hexdigest()[:12]}"
    if (out / "config.json").is_file():
        return out
    t0 = time.time()
    log(f"converting {path.name} ({path.stat().st_size / 1e6:.0f} MB) into an mlx-lm directory at {out} (once) ...")
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        convert(path, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a refused or interrupted conversion leaves nothing
        raise
    if not (out / "config.json").is_file():  # another process may have finished first
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    else:
        shutil.rmtree(tmp)
    log(f"converted in {time.time() - t0:.1f}s")
    return out


def convert(path: Path, out: Path):
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json to `out`."""
    tensors, meta = read(path)
    arch = meta.get("general.architecture")
    if arch is None:
        raise DFlashError(f"'{path}' has no GGUF metadata (general.architecture); is it a complete model file?")
    if arch != "llama":
        raise DFlashError(
            f"'{path}' is a GGUF of architecture '{arch}'; only 'llama' GGUF files are supported "
            "(for others use the model's Hugging Face / mlx-community repository)"
        )
    if "rope_freqs.weight" in tensors:
        raise DFlashError(
            f"'{path}' uses rope frequency scaling (rope_freqs, Llama 3.1 style), which the "
            "GGUF reader does not carry over; use the model's Hugging Face repository instead"
        )
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(meta, out)  # first: it refuses tokenizers it cannot build before any weights are written
    config = model_config(meta, tensors)
    weights = {}
    for name, array in tensors.items():
        base, _, kind = name.rpartition(".")  # kind: weight, scales or biases
        new = mlx_name(base, path)
        if base.endswith(("attn_q", "attn_k")):
            heads = config["num_attention_heads"] if base.endswith("attn_q") else config["num_key_value_heads"]
            array = unpermute_rows(array, heads)
        weights[f"{new}.{kind}"] = array
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))


def check_header(path: Path):
    """Walk the GGUF header (metadata and tensor table) with bounds checks before MLX reads it:
    MLX 0.32's reader crashes the process on a header whose counts or lengths run past the file."""
    import struct

    size = path.stat().st_size
    bad = DFlashError(f"'{path}' is not a readable GGUF file (a damaged or truncated header); re-download it")
    with open(path, "rb") as f:

        def take(n):
            if f.tell() + n > size:
                raise bad
            return f.read(n)

        def string():
            (n,) = struct.unpack("<Q", take(8))
            take(n)

        fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes

        def value(kind):
            if kind in fixed:
                take(fixed[kind])
            elif kind == 8:
                string()
            elif kind == 9:
                inner, count = struct.unpack("<IQ", take(12))
                if inner in fixed:
                    take(fixed[inner] * count)
                else:
                    for _ in range(count):
                        value(inner)
            else:
                raise bad

        if take(4) != b"GGUF":
            raise DFlashError(f"'{path}' is not a GGUF file (no GGUF magic number); give a .gguf model file")
        version, n_tensors, n_meta = struct.unpack("<IQQ", take(20))
        if version not in (2, 3) or n_tensors * 24 + n_meta * 12 > size:
            raise bad
        for _ in range(n_meta):
            string()
            value(struct.unpack("<I", take(4))[0])
        for _ in range(n_tensors):
            string()
            (dims,) = struct.unpack("<I", take(4))
            if dims > 8:
                raise bad
            take(8 * dims + 4 + 8)


def read(path: Path) -> tuple:
    check_header(path)
    try:
        return mx.load(str(path), return_metadata=True)
    except Exception as e:
        raise DFlashError(
            f"cannot read GGUF '{path}' ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "MLX reads F32, F16, Q4_0, Q4_1 and Q8_0 tensors: re-download the file or pick one "
            "of those quantizations"
        ) from None


def mlx_name(base: str, path) -> str:
    if base in TOP_NAMES:
        return TOP_NAMES[base]
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    raise DFlashError(f"GGUF '{path}' has a tensor '{base}' that a llama model does not; is it a llama GGUF?")


def unpermute_rows(array: mx.array, heads: int) -> mx.array:
    """Undo llama.cpp's q/k row order: within each head it stores the rotary pairs (i, i + d/2)
    next to each other; Hugging Face's layout keeps the two halves apart. The rows of a quantized
    weight and of its scales and biases move together (quantization groups run along columns)."""
    rows = array.shape[0]
    return array.reshape(heads, rows // heads // 2, 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)


def _scalar(meta: dict, key: str, default=None):
    value = meta.get(key, default)
    return value.item() if isinstance(value, mx.array) else value


def model_config(meta: dict, tensors: dict) -> dict:
    get = lambda key, default=None: _scalar(meta, f"llama.{key}", default)
    hidden, heads = get("embedding_length"), get("attention.head_count")
    if hidden is None or heads is None or get("block_count") is None:
        raise DFlashError("the GGUF lacks llama.embedding_length / attention.head_count / block_count; is it complete?")
    vocab = len(meta.get("tokenizer.ggml.tokens", [])) or get("vocab_size")
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length", hidden // heads),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 4096),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": _scalar(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _scalar(meta, "tokenizer.ggml.eos_token_id"),
    }
    bits = {}  # quantized layers: packed columns per group of the input dimension
    for name, scales in tensors.items():
        if name.endswith(".scales"):
            base = name.removesuffix(".scales")
            bits[mlx_name(base, "the file")] = tensors[f"{base}.weight"].shape[1] // scales.shape[1]
    if bits:
        common = Counter(bits.values()).most_common(1)[0][0]
        config["quantization"] = {"group_size": GROUP_SIZE, "bits": common, "mode": "affine"}
        config["quantization"].update(
            {p: {"group_size": GROUP_SIZE, "bits": b} for p, b in bits.items() if b != common}
        )
    return {k: v for k, v in config.items() if v is not None}


def write_tokenizer(meta: dict, out: Path):
    """tokenizer.json (byte-level BPE from the GGUF's tokens and merges) + tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise DFlashError(f"the GGUF's tokenizer is '{kind}'; only byte-level BPE ('gpt2') tokenizers are supported")
    if pre in DIGITS_THEN_BYTES:
        split = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    elif pre in BYTES_ONLY:
        split = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        raise DFlashError(
            f"the GGUF's pre-tokenizer '{pre}' is not supported (supported: "
            f"{', '.join(DIGITS_THEN_BYTES + BYTES_ONLY)})"
        )
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = split
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type")
    types = types.tolist() if isinstance(types, mx.array) else [1] * len(tokens)
    special = [t for t, ty in zip(tokens, types) if ty in (3, 4)]  # llama.cpp: 3 control, 4 user-defined
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    name = lambda key: tokens[_scalar(meta, key)] if _scalar(meta, key) is not None else None
    if _scalar(meta, "tokenizer.ggml.add_bos_token", False) and name("tokenizer.ggml.bos_token_id"):
        from tokenizers.processors import TemplateProcessing

        bos = name("tokenizer.ggml.bos_token_id")
        tok.post_processor = TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tokens.index(bos))]
        )
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # else transformers guesses a model-specific class
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "chat_template": meta.get("tokenizer.chat_template"),
        "model_max_length": _scalar(meta, "llama.context_length", 4096),
    }
    (out / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}, indent=2))
