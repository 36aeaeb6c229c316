"""GGUF targets: a llama GGUF written the way llama.cpp's converter writes one (q/k rows permuted,
llama.cpp tensor names, the tokenizer in the metadata) converts into an mlx-lm directory that
computes the same logits, stays lossless under DFlash, tokenizes like the original, fails with one
error line, and is converted once per file content."""

import json
import os
import struct
from pathlib import Path

import mlx.core as mx
import pytest
from cli_run import dflash_cli
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from tokenizers import pre_tokenizers

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.engine import OracleDraft
from dflash_core.engine.events import RunSummary
from dflash_core.errors import DFlashError
from dflash_core.models.loading import load_pair, load_target, resolve
from dflash_core.training.random_models import write_draft

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

# A tiny byte-level BPE vocabulary: the specials first (ids 0..3; the draft needs <|mask|>), the
# 256 byte symbols, then a few merged tokens. "12" / "123" exist so that a pre-tokenizer that does
# not split digits would give "123" as one token.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
TOKENS = SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["he", "ll", "hell", "hello", "Ġw", "12", "123"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "1 2", "12 3"]
ID = {t: i for i, t in enumerate(TOKENS)}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GGUF_NAMES = {  # mlx-lm name part -> llama.cpp's
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def random_llama(tie=True, seed=0):
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=len(TOKENS),
        rope_theta=10000.0,
        tie_word_embeddings=tie,
        rope_traditional=False,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    # norms away from all-ones, so that swapping attn_norm and ffn_norm would show in the logits
    for name, w in tree_flatten(model.parameters()):
        if name.endswith("norm.weight"):
            model.load_weights([(name, 1 + 0.3 * mx.random.normal(w.shape))], strict=False)
    mx.eval(model.parameters())
    return model, args


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute for q and k."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def unpermute(w, n_head):
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gguf_tensors(model, args) -> dict:
    out = {}
    for name, w in tree_flatten(model.parameters()):
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        elif name == "lm_head.weight":
            out["output.weight"] = w
        else:
            _, _, layer, *rest = name.split(".")
            part = ".".join(rest).removesuffix(".weight")
            if part == "self_attn.q_proj":
                w = permute(w, args.num_attention_heads)
            elif part == "self_attn.k_proj":
                w = permute(w, args.num_key_value_heads)
            out[f"blk.{layer}.{GGUF_NAMES[part]}.weight"] = w
    return out


def gguf_metadata(args, arch="llama", pre="smollm") -> dict:
    u32 = lambda v: mx.array(v, dtype=mx.uint32)
    f32 = lambda v: mx.array(v, dtype=mx.float32)
    return {
        "general.architecture": arch,
        "general.name": "tiny random llama",
        f"{arch}.embedding_length": u32(args.hidden_size),
        f"{arch}.block_count": u32(args.num_hidden_layers),
        f"{arch}.feed_forward_length": u32(args.intermediate_size),
        f"{arch}.attention.head_count": u32(args.num_attention_heads),
        f"{arch}.attention.head_count_kv": u32(args.num_key_value_heads),
        f"{arch}.attention.layer_norm_rms_epsilon": f32(args.rms_norm_eps),
        f"{arch}.rope.freq_base": f32(args.rope_theta),
        f"{arch}.context_length": u32(2048),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": mx.array([3 if t in SPECIALS else 1 for t in TOKENS], dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(ID["<|im_start|>"]),
        "tokenizer.ggml.eos_token_id": u32(ID["<|im_end|>"]),
        "tokenizer.chat_template": CHATML,
    }


def write_gguf(path, tie=True, seed=0, arch="llama", pre="smollm", extra_metadata=None):
    """A llama GGUF as llama.cpp writes one; returns (path, the original mlx-lm model)."""
    model, args = random_llama(tie, seed)
    meta = gguf_metadata(args, arch, pre) | (extra_metadata or {})
    mx.save_gguf(str(path), gguf_tensors(model, args), meta)
    return Path(path), model


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def logits(model, ids):
    return model(mx.array([ids])).astype(mx.float32)


def one_line_error(path) -> str:
    with pytest.raises(DFlashError) as e:
        resolve(str(path), "target")
    msg = str(e.value)
    assert msg and "\n" not in msg and "Traceback" not in msg
    return msg


# 1. conversion round trip -----------------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_gives_the_same_logits(tmp_path, cache, tie):
    path, original = write_gguf(tmp_path / "tiny.gguf", tie=tie)
    out = resolve(str(path), "target")
    assert out.is_dir() and out.parent == cache / "gguf" and out.name.startswith("tiny-")
    assert {p.name for p in out.iterdir()} == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is tie and "quantization" not in cfg
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]) == (64, 2, 128)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 16)
    assert cfg["vocab_size"] == len(TOKENS) and cfg["max_position_embeddings"] == 2048
    assert cfg["rope_theta"] == 10000.0 and cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["eos_token_id"] == ID["<|im_end|>"] and cfg["bos_token_id"] == ID["<|im_start|>"]

    model, _, _ = load_target(out)
    assert ("lm_head" in dict(model.children())) is not tie
    ids = [ID["hello"], ID["Ġw"], 40, 7, 100, ID["<|im_end|>"], 250, 5]
    diff = mx.abs(logits(model, ids) - logits(original, ids)).max().item()
    assert diff < 1e-4, diff


def test_unpermuted_q_and_k_matter(tmp_path, cache):
    """The round trip above is a real check: a GGUF whose q/k rows were NOT permuted by the writer
    converts into a model with other logits."""
    model, args = random_llama()
    tensors = gguf_tensors(model, args)
    for name in list(tensors):
        if name.endswith(("attn_q.weight", "attn_k.weight")):  # undo the writer's permutation
            heads = args.num_attention_heads if "attn_q" in name else args.num_key_value_heads
            tensors[name] = unpermute(tensors[name], heads)
    mx.save_gguf(str(tmp_path / "plain.gguf"), tensors, gguf_metadata(args))
    converted, _, _ = load_target(resolve(str(tmp_path / "plain.gguf"), "target"))
    ids = [ID["hello"], 40, 7, 100, 250]
    assert mx.abs(logits(converted, ids) - logits(model, ids)).max().item() > 1e-3


# 2. lossless through the engine -------------------------------------------------------------------


def run(gen):
    events = list(gen)
    assert isinstance(events[-1], RunSummary)
    return events[-1]


def test_gguf_target_is_lossless(tmp_path, cache):
    path, _ = write_gguf(tmp_path / "target.gguf", tie=False, seed=3)
    draft = write_draft(tmp_path / "draft", resolve(str(path), "target"), layers=1, block_size=16, seed=4)
    pair = load_pair(str(path), str(draft))
    assert pair.block_size == 16 and pair.context_length == 2048
    for prompt in ["hello world, 123 hello", "def f(x):\n    return x * 42"]:
        ids = pair.encode(prompt, chat_template=False)
        base = run(pair.baseline(ids, 40))
        assert len(base.tokens) > 0
        for block in (16, 5):
            ours = run(pair.dflash(ids, 40, block, min_confidence=0.0))
            assert ours.tokens == base.tokens, (prompt, block)
            # a draft that proposes the right tokens: whole blocks accepted, the same output
            oracle = run(pair.dflash(ids, 40, block, draft_fn=OracleDraft(len(ids), base.tokens)))
            assert oracle.tokens == base.tokens and oracle.cycles < len(base.tokens) / 2, (prompt, block)
    chat = pair.encode("hello")  # the GGUF's chat template came along
    assert chat[0] == ID["<|im_start|>"] and ID["<|im_end|>"] in chat


# 3. the tokenizer from the metadata ---------------------------------------------------------------


def converted_tokenizer(tmp_path, pre="smollm", extra_metadata=None):
    from mlx_lm.utils import load_tokenizer

    path, _ = write_gguf(tmp_path / f"tok-{pre}.gguf", pre=pre, extra_metadata=extra_metadata)
    return load_tokenizer(resolve(str(path), "target"))


def test_tokenizer_from_metadata(tmp_path, cache):
    tok = converted_tokenizer(tmp_path)
    assert tok.encode("hello", add_special_tokens=False) == [ID["hello"]]
    expected = [ID[t] for t in ["hello", "Ġw", "o", "r", "l", "d"]]
    assert expected == [263, 264, 82, 85, 79, 71]  # the ids themselves, from the vocabulary's layout
    assert tok.encode("hello world", add_special_tokens=False) == expected
    # smollm splits digits one by one before BPE: the "1 2" / "12 3" merges never apply
    assert tok.encode("123", add_special_tokens=False) == [ID["1"], ID["2"], ID["3"]]
    # a special token in the text is one id, not its characters
    assert tok.encode("hello<|im_end|>hello", add_special_tokens=False) == [ID["hello"], 2, ID["hello"]]
    assert tok.decode(tok.encode("hello world 42", add_special_tokens=False)) == "hello world 42"
    assert tok.eos_token_id == ID["<|im_end|>"] and tok.bos_token == "<|im_start|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_gpt2_pre_tokenizer_keeps_digits_together(tmp_path, cache):
    tok = converted_tokenizer(tmp_path, pre="gpt2")
    assert tok.encode("123", add_special_tokens=False) == [ID["123"]]
    assert tok.encode("hello world", add_special_tokens=False) == [ID[t] for t in ["hello", "Ġw", "o", "r", "l", "d"]]


def test_add_bos_token(tmp_path, cache):
    tok = converted_tokenizer(tmp_path, extra_metadata={"tokenizer.ggml.add_bos_token": mx.array(True)})
    assert tok.encode("hello") == [ID["<|im_start|>"], ID["hello"]]
    assert tok.encode("hello", add_special_tokens=False) == [ID["hello"]]


# 4. errors: one DFlashError line ----------------------------------------------------------------


def finished_conversions(cache) -> list:
    return [p.name for p in (cache / "gguf").iterdir() if ".partial-" not in p.name]


def test_corrupt_files(tmp_path, cache):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    assert "is not a GGUF file" in one_line_error(junk)
    path, _ = write_gguf(tmp_path / "full.gguf")
    data = path.read_bytes()
    # incomplete downloads: the tensor data cut (MLX refuses it), or the header itself cut
    for name, cut, says in [("half.gguf", len(data) // 2, "cannot read GGUF"), ("header.gguf", 64, "truncated header")]:
        (tmp_path / name).write_bytes(data[:cut])
        assert says in one_line_error(tmp_path / name), name


def test_other_architecture(tmp_path, cache):
    path, _ = write_gguf(tmp_path / "qwen.gguf", arch="qwen2")
    msg = one_line_error(path)
    assert "'qwen2'" in msg and "llama" in msg


def test_unknown_pre_tokenizer(tmp_path, cache):
    path, _ = write_gguf(tmp_path / "pre.gguf", pre="some-unknown-pre")
    msg = one_line_error(path)
    assert "'some-unknown-pre'" in msg and "smollm" in msg
    assert finished_conversions(cache) == []  # the failed conversion is not taken for a finished one
    assert "'some-unknown-pre'" in one_line_error(path)


def test_sentencepiece_tokenizer(tmp_path, cache):
    """Llama 2 style GGUFs carry a SentencePiece vocabulary (tokenizer.ggml.model 'llama')."""
    path, _ = write_gguf(tmp_path / "spm.gguf", extra_metadata={"tokenizer.ggml.model": "llama"})
    msg = one_line_error(path)
    assert "'llama'" in msg and "'gpt2'" in msg


def test_failed_conversion_leaves_nothing(tmp_path, cache):
    path, _ = write_gguf(tmp_path / "pre.gguf", pre="some-unknown-pre")
    one_line_error(path)
    assert list((cache / "gguf").iterdir()) == []


def cli_generate(tmp_path, model, *extra):
    env = {**os.environ, "DFLASH_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    return dflash_cli("generate", "--model", model, "--prompt", "hi", *extra, env=env, timeout=120)


def cli_error_line(out) -> str:
    """The one `error:` line of a failed CLI run (the lines before it are progress: loading, converting)."""
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], out.stderr
    return errors[0]


def test_cli_bad_gguf_is_one_error_line(tmp_path):
    path, _ = write_gguf(tmp_path / "full.gguf")
    bad = tmp_path / "BAD.gguf"
    bad.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    (tmp_path / "draft").mkdir()
    # with a draft given, the GGUF is read; without one, the registry answers first (no known draft)
    assert "cannot read GGUF" in cli_error_line(cli_generate(tmp_path, bad, "--draft", str(tmp_path / "draft")))
    assert "no known DFlash draft" in cli_error_line(cli_generate(tmp_path, bad))
    qwen, _ = write_gguf(tmp_path / "qwen.gguf", arch="qwen2")
    assert "'qwen2'" in cli_error_line(cli_generate(tmp_path, qwen, "--draft", str(tmp_path / "draft")))


def test_cli_corrupt_header_is_one_error_line(tmp_path):
    bad = tmp_path / "BAD.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0))  # version 3, 2**40 tensors, no metadata
    (tmp_path / "draft").mkdir()
    assert "damaged or truncated header" in cli_error_line(
        cli_generate(tmp_path, bad, "--draft", str(tmp_path / "draft"))
    )


# 5. the cache -------------------------------------------------------------------------------------


def test_converted_once_per_content(tmp_path, cache, capsys):
    path, _ = write_gguf(tmp_path / "m.gguf", seed=0)
    first = resolve(str(path), "target")
    assert "converting m.gguf" in capsys.readouterr().err
    stat = (first / "model.safetensors").stat()
    assert resolve(str(path), "target") == first
    assert "converting" not in capsys.readouterr().err
    again = (first / "model.safetensors").stat()
    assert (again.st_mtime_ns, again.st_ino) == (stat.st_mtime_ns, stat.st_ino)
    assert [p.name for p in (cache / "gguf").iterdir()] == [first.name]  # no .partial left behind

    write_gguf(path, seed=1)  # the same name, other weights
    second = resolve(str(path), "target")
    assert "converting m.gguf" in capsys.readouterr().err
    assert second != first and second.parent == first.parent
    assert (first / "model.safetensors").stat().st_mtime_ns == stat.st_mtime_ns
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == sorted([first.name, second.name])
