"""The trainers: train-target writes a loadable mlx-lm model; train-draft's loss falls and its
checkpoint loads through the engine's loader and decodes exactly like plain greedy; the
training forward is the inference forward."""

import inspect
import json
import shutil
from dataclasses import replace
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from code_prompts import PROMPTS
from mlx.utils import tree_flatten

from dflash_core.cli import main
from dflash_core.engine.draft import DraftContext
from dflash_core.engine.target import Target
from dflash_core.models.loading import load_pair, resolve
from dflash_core.models.registry import DEFAULT_PAIR, SHIPPED
from dflash_core.training import decoding, train_draft
from dflash_core.training.decoding import decode_batch, greedy, load_frozen_target, regenerate
from dflash_core.training.draft_blocks import block_logits, make_batch, tapped_hidden, teacher_logits
from dflash_core.training.draft_data import Sequences, draft_vocab
from dflash_core.training.train_draft import add_layers

pytestmark = pytest.mark.slow

TINY_TARGET = [
    "--vocab-size",
    "512",
    "--hidden",
    "64",
    "--layers",
    "4",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--intermediate",
    "128",
    "--seq-len",
    "96",
    "--batch-size",
    "8",
    "--steps",
    "30",
    "--eval-every",
    "10",
    "--log-every",
    "10",
    "--no-compile",
]
TINY_DRAFT = [
    "--num-prompts",
    "24",
    "--response-tokens",
    "48",
    "--max-prompt-tokens",
    "48",
    "--batch-size",
    "4",
    "--anchors",
    "16",
    "--epochs",
    "8",
    "--lr",
    "3e-3",
    "--eval-every",
    "0",
    "--eval-prompts",
    "2",
    "--eval-tokens",
    "24",
    "--log-every",
    "10",
    "--no-compile",
]


def run_train_draft(target, data, out, *args) -> int:
    """`train-draft` through the CLI on a target and data, writing to out."""
    return main(["train-draft", "--target", str(target), "--data", str(data), "--out", str(out), *args])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import collections
    import json as j
    import textwrap

    root = tmp_path_factory.mktemp("corpus")
    for m in (collections, j.decoder, textwrap):
        (root / f"{m.__name__.replace('.', '_')}.py").write_text(inspect.getsource(m))
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    """A tiny target from train-target, and a draft for it from train-draft (both via the CLI)."""
    root = tmp_path_factory.mktemp("trained")
    target, draft = root / "target", root / "draft"
    assert main(["train-target", "--out", str(target), "--corpus", str(corpus), *TINY_TARGET]) == 0
    assert run_train_draft(target, corpus, draft, "--layers", "1", *TINY_DRAFT) == 0
    return target, draft


def test_train_target_writes_an_mlx_lm_model(trained):
    from mlx_lm.utils import load

    target, _ = trained
    cfg = json.loads((target / "config.json").read_text())
    for key in ("model_type", "rope_theta", "tie_word_embeddings", "eos_token_id"):
        assert key in cfg
    tok_cfg = json.loads((target / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and tok_cfg["chat_template"]
    assert {v.dtype for v in mx.load(str(target / "model.safetensors")).values()} == {mx.float16}
    model, tokenizer = load(str(target))
    assert set(tokenizer.eos_token_ids) == set(cfg["eos_token_id"])
    assert (target / "README.md").read_text().startswith("# stdlib target")
    summary = json.loads((target / "training.json").read_text())
    assert summary["steps"] == 30 and np.isfinite(summary["heldout_loss"])


def test_large_weights_are_sharded_and_load_the_same(tmp_path, trained):
    """Over the shard size the weights go to model-0000k-of-0000n files with an index; mlx-lm
    and this project's loader read them back to the same logits."""
    from mlx_lm.utils import load

    from dflash_core.training.common import write_weights

    target, _ = trained
    sharded = tmp_path / "sharded"
    shutil.copytree(target, sharded)
    weights = mx.load(str(target / "model.safetensors"))
    write_weights(sharded, weights, max_shard_bytes=sum(w.nbytes for w in weights.values()) // 3)
    files = sorted(f.name for f in sharded.glob("*.safetensors"))
    assert len(files) >= 3 and "model.safetensors" not in files and files[0].startswith("model-00001-of-")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(weights) and set(index["weight_map"].values()) == set(files)
    ids = mx.array([[5, 6, 7, 8]])
    (a, _), (b, _) = load(str(target)), load(str(sharded))
    assert mx.array_equal(a(ids), b(ids))
    write_weights(sharded, weights)  # saved again under the limit: one file, no stale shards
    assert sorted(f.name for f in sharded.glob("model*")) == ["model.safetensors"]


def test_train_draft_loss_falls(trained):
    summary = json.loads((trained[1] / "training.json").read_text())
    assert summary["final_loss"] < 0.7 * summary["first_loss"], summary


def test_draft_checkpoint_is_public_format_and_lossless(trained):
    target, draft = trained
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["dflash_config"]["target_layer_ids"] and cfg["dflash_config"]["mask_token_id"] is not None
    names = set(mx.load(str(draft / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= names
    assert all(n.split(".")[0] in {"fc", "hidden_norm", "norm", "layers"} for n in names)
    pair = load_pair(str(target), str(draft))
    for prompt in ("def fib(n):", "class Stack:\n    def push(self, item):"):
        ids = pair.encode(prompt)
        *_, ours = pair.dflash(ids, 40)
        *_, ref = pair.baseline(ids, 40)
        assert ours.tokens == ref.tokens


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_training_forward_equals_engine_forward(random_pairs, family):
    """Many blocks at once with the block-sparse mask give the logits the engine's draft gives
    one block at a time, and the training taps equal the engine's prefill taps."""
    pair = random_pairs[family]
    target, draft = pair.target, pair.draft
    B, mask = draft.config.block_size, draft.config.mask_token_id
    ids = [int(x) for x in np.random.default_rng(0).integers(5, 400, size=50)]
    taps = tapped_hidden(target, mx.array([ids]))
    engine_taps = []
    target.prefill(ids, on_taps=engine_taps.append)
    for got, want in zip(taps, zip(*engine_taps)):
        assert mx.allclose(got, mx.concatenate(want, axis=1), atol=1e-4)
    anchors = [7, 21, 33]
    blocks = np.full((len(anchors), B), mask, dtype=np.int32)
    blocks[:, 0] = [ids[a] for a in anchors]
    many = block_logits(
        draft, target.head, taps, target.embed(mx.array(blocks)), mx.array(anchors), mx.array([0] * len(anchors))
    )
    for j, a in enumerate(anchors):
        ctx = DraftContext(draft)
        ctx.extend([h[:, :a] for h in taps])  # the committed positions before the anchor
        one = target.head(draft(target.embed(mx.array(blocks[j]))[None], ctx.kv, ctx.length)[:, 1:])
        assert mx.allclose(one[0], many[j], atol=1e-4)


def test_train_draft_on_hybrid_target_is_lossless(tmp_path, random_dirs, corpus):
    """A random GatedDeltaNet target: regeneration, taps, falling loss, and the trained draft
    through the GDN rollback."""
    target, _ = random_dirs["qwen3_5"]
    out = tmp_path / "draft"
    assert run_train_draft(target, corpus, out, *TINY_DRAFT[:-1], "--epochs", "2") == 0
    summary = json.loads((out / "training.json").read_text())
    assert summary["final_loss"] < summary["first_loss"], summary
    pair = load_pair(str(target), str(out))
    ids = pair.encode("import os\nfor name in os.listdir('.'):\n")
    *_, ours = pair.dflash(ids, 32)
    *_, ref = pair.baseline(ids, 32)
    assert ours.tokens == ref.tokens


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_regenerate_rows_are_the_engines_greedy_continuations(random_dirs, family):
    """The batched regeneration (prompts of different lengths, one of a single token, in two
    batches) gives row for row the engine's plain greedy continuation, cut after its first EOS,
    which becomes the tokenizer's first EOS id; once every row has stopped, it stops."""
    model, tokenizer = load_frozen_target(str(random_dirs[family][0]))
    prompts = [tokenizer.encode(p) for p in PROMPTS] + [[7], tokenizer.encode(" ".join(PROMPTS))]
    assert len({len(p) for p in prompts}) == len(prompts)
    max_new = 40
    natural = [greedy(model, p, max_new, set(tokenizer.eos_token_ids)) for p in prompts]
    # EOS ids chosen from those continuations: 5th tokens stop some rows early, 2nd tokens every row
    first = list(tokenizer.eos_token_ids)[0]
    for eos in ([first, natural[0][4], natural[3][4]], [first, *{r[1] for r in natural}]):
        want = []
        for p in prompts:
            row = greedy(model, p, max_new, set(eos))
            want.append(row[:-1] + [first] if row[-1] in eos else row)
        got = regenerate(model, SimpleNamespace(eos_token_ids=eos), prompts, max_new, 4, log=lambda _: None)
        assert got == want
        assert any(len(r) < max_new for r in got)
    assert max(map(len, want)) <= 3 and len(decode_batch(model, prompts, max_new, eos)[0]) < max_new


def test_regenerate_halves_batches_that_mlx_refuses(random_dirs, monkeypatch):
    """Where a batch is refused (MLX CUDA raised a RuntimeError for large qwen3_5 batches), the
    rest is generated in halved batches, rows unchanged; a refused single row is an error."""
    model, tokenizer = load_frozen_target(str(random_dirs["qwen3"][0]))
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    want = regenerate(model, tokenizer, prompts, 12, 8, log=lambda _: None)
    real, sizes, logs = decoding.decode_batch, [], []

    def refuse_large(model, chunk, *args):
        sizes.append(len(chunk))
        if len(chunk) > 2:
            raise RuntimeError("cudaGraphAddKernelNode failed: invalid argument")
        return real(model, chunk, *args)

    monkeypatch.setattr(decoding, "decode_batch", refuse_large)
    assert regenerate(model, tokenizer, prompts, 12, 8, log=logs.append) == want
    assert sizes[:3] == [len(prompts), 4, 2] and set(sizes[3:]) <= {1, 2}
    assert any("batches of 2" in m for m in logs)

    def refuse_all(model, chunk, *args):
        raise RuntimeError("refused")

    monkeypatch.setattr(decoding, "decode_batch", refuse_all)
    with pytest.raises(RuntimeError, match="refused"):
        regenerate(model, tokenizer, prompts, 12, 8, log=lambda _: None)


def test_regenerate_samples_replies_at_a_temperature(random_dirs):
    """--reply-temperature: replies drawn from the target's distribution (same seed, same rows;
    not the greedy rows), each row still cut after its first EOS."""
    model, tokenizer = load_frozen_target(str(random_dirs["qwen3"][0]))
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    greedy_rows = regenerate(model, tokenizer, prompts, 12, 8, log=lambda _: None)
    sampled = []
    for _ in range(2):
        mx.random.seed(7)
        sampled.append(regenerate(model, tokenizer, prompts, 12, 8, log=lambda _: None, temperature=1.0))
    assert sampled[0] == sampled[1] and sampled[0] != greedy_rows
    eos = set(tokenizer.eos_token_ids)
    assert all(t not in eos for row in sampled[0] for t in row[:-1])


def test_train_draft_bad_input_is_one_error_line(tmp_path, capsys, random_dirs):
    assert main(["train-draft", "--target", str(tmp_path / "nope"), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    target, _ = random_dirs["qwen3"]
    assert main(["train-draft", "--target", str(target), "--out", str(tmp_path / "d"), "--target-layers", "99"]) == 2
    assert "outside the target" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["train-draft", "--gen-batch", "0"], "--gen-batch: 0 is too small"),
        (["train-draft", "--anchors", "-4"], "--anchors: -4 is too small"),
        (["train-draft", "--val-sequences", "-1"], "--val-sequences: -1 is negative"),
        (["train-draft", "--distill", "1.5"], "--distill: 1.5 is not between 0 and 1"),
        (["train-draft", "--add-layers", "1"], "give --resume DRAFT too"),
        (["train-target", "--layers", "0"], "--layers: 0 is too small"),
        (["train-target", "--hidden", "100", "--heads", "3"], "do not make a qwen3 model"),
        (["train-target", "--heads", "4", "--kv-heads", "3"], "do not make a qwen3 model"),
        (
            ["train-target", "--arch", "qwen3_5", "--heads", "5", "--hidden", "80", "--kv-heads", "1"],
            "do not make a qwen3_5 model",
        ),
    ],
)
def test_trainers_bad_sizes_are_one_error_line_before_any_work(argv, says, tmp_path, capsys, random_dirs):
    """Sizes and shares are checked as they are parsed, and a model shape mlx-lm cannot build is
    refused before the tokenizer trains: one error line, exit 2, nothing written."""
    target, _ = random_dirs["qwen3"]
    first = ["--target", str(target)] if argv[0] == "train-draft" else []
    assert main([argv[0], *first, "--out", str(tmp_path / "out"), *argv[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and says in err[0], err
    assert not (tmp_path / "out").exists()


def test_trainer_modules_run_alone_give_the_same_error_line(tmp_path):
    """`python -m dflash_core.commands.train_target` (the reproduce scripts' form) parses like the CLI."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "dflash_core.commands.train_target", "--out", str(tmp_path / "t"), "--seq-len", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: argument --seq-len: -1 is too small: give a whole number >= 1 "
        "(see `python -m dflash_core.commands.train_target --help`)"
    ]


def test_data_only_writes_the_regenerated_data_for_later_runs(tmp_path, capsys, random_dirs, corpus):
    """--data-only regenerates once and trains nothing; a later run reuses the file as its data."""
    target, _ = random_dirs["qwen3"]
    out, cache = tmp_path / "draft", tmp_path / "data.json"
    assert main(["train-draft", "--target", str(target), "--out", str(out), "--data-only"]) == 2
    assert "--data-cache" in capsys.readouterr().err
    assert run_train_draft(target, corpus, out, "--data-only", "--data-cache", str(cache), *TINY_DRAFT) == 0
    saved = json.loads(cache.read_text())
    assert not out.exists() and not cache.with_suffix(".partial").exists()
    assert len(saved["prompts"]) == len(saved["responses"]) > 0
    assert all(0 < len(r) <= 48 + 1 for r in saved["responses"])  # response tokens (+ EOS)
    capsys.readouterr()
    assert run_train_draft(target, corpus, out, "--data-cache", str(cache), *TINY_DRAFT[:-1], "--epochs", "1") == 0
    distinct = len({tuple(p) for p in saved["prompts"]})  # a prompt drawn twice trains once
    assert f"{distinct} regenerated sequences from {cache}" in capsys.readouterr().out
    assert (out / "model.safetensors").is_file()


def test_several_data_files_are_merged_without_repeated_prompts(tmp_path, capsys, random_dirs, corpus):
    """--data-cache A B: data regenerated in pieces (one --data-only run per seed) trains as one
    set; a prompt both pieces drew counts once; a missing piece is one error line."""
    target, _ = random_dirs["qwen3"]
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "draft"
    assert run_train_draft(target, corpus, out, "--data-only", "--data-cache", str(a), *TINY_DRAFT) == 0
    first = json.loads(a.read_text())
    distinct = len({tuple(p) for p in first["prompts"]})
    extra = [7, 8, 9]
    assert extra not in first["prompts"]
    b.write_text(
        json.dumps(
            {
                "target": first["target"],
                "prompts": first["prompts"][:3] + [extra],
                "responses": first["responses"][:3] + [[10, 11, 12]],
            }
        )
    )
    capsys.readouterr()
    assert run_train_draft(target, corpus, out, "--data-cache", str(a), str(b), *TINY_DRAFT[:-1], "--epochs", "1") == 0
    log = capsys.readouterr().out
    assert f"{distinct + 1} regenerated sequences from 2 files" in log  # + the new one only
    assert f"data: {distinct + 1} sequences" in log  # what the trainer then trains on
    assert (
        main(
            [
                "train-draft",
                "--target",
                str(target),
                "--out",
                str(out),
                "--data-cache",
                str(a),
                str(tmp_path / "missing.json"),
                *TINY_DRAFT,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.json does not exist" in err[0]
    assert (
        main(["train-draft", "--target", str(target), "--out", str(out), "--data-only", "--data-cache", str(a), str(b)])
        == 2
    )
    assert "one file" in capsys.readouterr().err


def test_renamed_names_are_consistent_and_keep_the_code_valid(corpus):
    """Renamed copies (train-target --renamed-copies, train-draft --rename-fraction) stay valid
    Python, swap each chosen name for one other name everywhere, and leave keywords, builtins and
    attributes alone."""
    import ast
    import io
    import random
    import tokenize

    from dflash_core.training.corpus import with_renamed_names

    texts = [f.read_text() for f in sorted(corpus.glob("*.py"))]
    assert with_renamed_names(texts, 0.0, random.Random(0)) == texts
    renamed = with_renamed_names(texts, 1.0, random.Random(0))
    names = lambda src: [t for t in tokenize.generate_tokens(io.StringIO(src).readline)]
    for old, new in zip(texts, renamed):
        assert new != old
        ast.parse(new)
        a, b = names(old), names(new)
        assert [t.type for t in a] == [t.type for t in b]  # same token stream shape
        swap = {}
        for i, (x, y) in enumerate(zip(a, b)):
            if x.type != tokenize.NAME:
                continue
            after_dot = i > 0 and a[i - 1].string == "."
            if after_dot or x.string in ("self", "def", "return", "len", "isinstance"):
                assert y.string == x.string, (x.string, y.string)
            else:
                assert swap.setdefault(x.string, y.string) == y.string  # one new name per old name
        assert any(k != v for k, v in swap.items())
        assert len(set(swap.values())) == len(swap)  # no two names became one


def test_train_target_renamed_copies_and_keep_last(tmp_path, corpus, trained):
    """--renamed-copies adds training data but not tokenizer input; --keep last keeps the final
    weights even when an earlier step had a lower held-out loss."""
    out = tmp_path / "t"
    assert (
        main(
            [
                "train-target",
                "--out",
                str(out),
                "--corpus",
                str(corpus),
                *TINY_TARGET,
                "--renamed-copies",
                "1",
                "--keep",
                "last",
            ]
        )
        == 0
    )
    summary = json.loads((out / "training.json").read_text())
    assert summary["keep"] == "last" and summary["kept_step"] == summary["steps"] == 30
    assert summary["lowest_heldout_loss"]["loss"] <= summary["heldout_loss"]
    assert (out / "tokenizer.json").read_text() == (trained[0] / "tokenizer.json").read_text()
    base = json.loads((trained[0] / "training.json").read_text())
    assert summary["train_files"] == base["train_files"]
    assert summary["corpus_tokens"] > 1.5 * base["corpus_tokens"]  # the originals + one renamed copy
    assert "plus 1 renamed copy of each" in (out / "README.md").read_text()


def test_added_layers_start_as_the_identity_then_train(tmp_path, corpus, trained):
    """--resume D --add-layers 1: the grown draft's first forward equals D's (the new layer passes
    the residual stream through), and training it from there writes a deeper draft that learns and
    runs lossless."""
    target, draft_dir = trained
    pair = load_pair(str(target), str(draft_dir))
    grown = add_layers(pair.draft, 1)
    assert len(grown.layers) == len(pair.draft.layers) + 1
    block = pair.target.embed(mx.array([5] + [grown.config.mask_token_id] * 15))[None]
    taps = []
    pair.target.prefill(pair.encode("def fib(n):"), on_taps=taps.append)
    ctx, grown_ctx = DraftContext(pair.draft), DraftContext(grown)
    for chunk in taps:
        ctx.extend(chunk)
        grown_ctx.extend(chunk)
    assert mx.allclose(pair.draft(block, ctx.kv, ctx.length), grown(block, grown_ctx.kv, grown_ctx.length), atol=1e-5)

    out = tmp_path / "grown"
    assert (
        run_train_draft(
            target,
            corpus,
            out,
            "--resume",
            str(draft_dir),
            "--add-layers",
            "1",
            *TINY_DRAFT[:-1],
            "--epochs",
            "2",
        )
        == 0
    )
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == len(pair.draft.layers) + 1
    grown_pair = load_pair(str(target), str(out))
    ids = grown_pair.encode("class Stack:\n    def push(self, item):")
    *_, ours = grown_pair.dflash(ids, 40)
    *_, ref = grown_pair.baseline(ids, 40)
    assert ours.tokens == ref.tokens
    assert main(["train-draft", "--target", str(target), "--out", str(tmp_path / "x"), "--add-layers", "1"]) == 2


def test_resume_with_another_block_size_retrains_the_draft_for_it(tmp_path, corpus, trained):
    """--resume D --block-size 8: the same weights trained on blocks of 8 (the loss over 7
    positions, gamma 4); the written draft says 8 and runs lossless at it."""
    target, draft_dir = trained
    assert json.loads((draft_dir / "config.json").read_text())["block_size"] == 16
    out = tmp_path / "b8"
    argv = ["train-draft", "--target", str(target), "--data", str(corpus), "--out", str(out)]
    assert main([*argv, "--resume", str(draft_dir), "--block-size", "8", *TINY_DRAFT[:-1], "--epochs", "1"]) == 0
    assert json.loads((out / "config.json").read_text())["block_size"] == 8
    record = json.loads((out / "training.json").read_text())
    assert (record["block_size"], record["loss_gamma"]) == (8, 4.0)
    pair = load_pair(str(target), str(out))
    assert pair.block_size == 8
    ids = pair.encode("def fib(n):")
    *_, ours = pair.dflash(ids, 40)
    *_, ref = pair.baseline(ids, 40)
    assert ours.tokens == ref.tokens


def test_distill_teacher_is_the_targets_distribution_at_each_label():
    """The teacher logits for a block's labels come from the target's own forward one position
    earlier: on the target's own greedy data their argmax is the label. (The shipped target: a
    tiny one repeats itself, so a shifted teacher would agree too.)"""
    model, tokenizer = load_frozen_target(str(resolve(str(SHIPPED[DEFAULT_PAIR][0]), "target")))
    target = Target(model, [0, len(model.layers) - 1])
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    data = Sequences(prompts, regenerate(model, tokenizer, prompts, 40, 8, log=lambda _: None), pad_id=0)
    cfg = SimpleNamespace(block_size=8, mask_token_id=1)
    rows = np.arange(len(data))
    _, anchors, seq_of_block, labels, weights, _ = make_batch(data, rows, 6, cfg, mx.ones(7), np.random.default_rng(0))
    last = target.sequence_taps(mx.array(data.ids[rows]))[-1]
    teacher = teacher_logits(target.head, target.inner.norm(last), mx.array(anchors), mx.array(seq_of_block), 8)
    valid = np.array(weights) > 0
    agree = np.array(mx.argmax(teacher, axis=-1))[valid] == labels[valid]
    assert valid.sum() > 100 and agree.mean() > 0.95, agree.mean()


def test_distill_trains_with_the_last_layer_recorded_besides_the_taps(tmp_path, corpus, trained):
    """--distill with taps that leave out the target's last layer (recorded besides them, cached
    with them), in the compiled training step: the loss falls and the draft runs lossless;
    out-of-range shares are one error line."""
    target, _ = trained
    first = {}
    for share in ("0", "0.5"):
        out = tmp_path / f"kd{share}"
        assert (
            run_train_draft(
                target,
                corpus,
                out,
                "--layers",
                "1",
                "--target-layers",
                "0",
                "2",
                "--distill",
                share,
                "--cache-taps",
                *TINY_DRAFT[:-1],
            )
            == 0
        )
        s = json.loads((out / "training.json").read_text())
        assert s["distill"] == float(share) and s["final_loss"] < 0.8 * s["first_loss"], s
        first[share] = s["first_loss"]
        assert ("whole next-token distribution" in (out / "README.md").read_text()) == (share != "0")
    assert first["0.5"] != pytest.approx(first["0"], rel=1e-3)  # the same start, another loss
    pair = load_pair(str(target), str(out))
    ids = pair.encode("def fib(n):")
    *_, ours = pair.dflash(ids, 40)
    *_, ref = pair.baseline(ids, 40)
    assert ours.tokens == ref.tokens
    assert main(["train-draft", "--target", str(target), "--out", str(tmp_path / "x"), "--distill", "1.5"]) == 2


def test_cache_taps_trains_the_same_draft(tmp_path, corpus, trained):
    """--cache-taps computes the frozen target's taps once instead of every step: same losses."""
    target, _ = trained
    losses = []
    for flag in ([], ["--cache-taps"]):
        out = tmp_path / f"d{len(flag)}"
        assert (
            run_train_draft(
                target,
                corpus,
                out,
                "--layers",
                "1",
                "--target-layers",
                "0",
                "2",
                "--data-cache",
                str(tmp_path / "data.json"),
                *TINY_DRAFT[:-1],
                "--epochs",
                "2",
                *flag,
            )
            == 0
        )
        s = json.loads((out / "training.json").read_text())
        losses.append((s["first_loss"], s["final_loss"]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-3), losses


def test_bfloat16_compute_trains_float32_masters(tmp_path, corpus, trained):
    """--compute-dtype bfloat16 runs forward and backward in 16 bits over float32 master weights:
    it starts at the float32 run's loss (to bfloat16 rounding), learns, and saves a draft that
    decodes exactly like plain greedy."""
    target, _ = trained
    runs = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        assert (
            run_train_draft(
                target,
                corpus,
                out,
                "--layers",
                "1",
                "--data-cache",
                str(tmp_path / "data" / "cache.json"),
                *TINY_DRAFT,
                "--compute-dtype",
                dtype,
            )
            == 0
        )
        runs[dtype] = json.loads((out / "training.json").read_text())
    f32, bf16 = runs["float32"], runs["bfloat16"]
    assert bf16["first_loss"] == pytest.approx(f32["first_loss"], rel=2e-2)
    assert bf16["final_loss"] < 0.7 * bf16["first_loss"]
    pair = load_pair(str(target), str(tmp_path / "bfloat16"))
    assert {p.dtype for _, p in tree_flatten(pair.draft.parameters())} == {mx.float32}
    ids = pair.encode("def fib(n):")
    assert list(pair.dflash(ids, 40))[-1].tokens == list(pair.baseline(ids, 40))[-1].tokens


def test_train_target_bfloat16_compute_matches_float32(tmp_path, corpus, trained):
    """train-target --compute-dtype bfloat16 (16-bit forward/backward, float32 masters) follows
    the float32 run of the same seed to within bfloat16 rounding."""
    out = tmp_path / "t"
    assert (
        main(["train-target", "--out", str(out), "--corpus", str(corpus), *TINY_TARGET, "--compute-dtype", "bfloat16"])
        == 0
    )
    bf16 = json.loads((out / "training.json").read_text())
    f32 = json.loads((trained[0] / "training.json").read_text())
    assert bf16["final_train_loss"] == pytest.approx(f32["final_train_loss"], rel=0.05)
    assert bf16["heldout_loss"] == pytest.approx(f32["heldout_loss"], rel=0.05)
    assert bf16["heldout_loss"] < np.log(bf16["vocab"]) - 0.5  # it learned (uniform guessing: log V)


def test_val_sequences_are_held_out_and_their_loss_is_reported(tmp_path, corpus, trained):
    """--val-sequences N: N sequences of the data are never trained on; every evaluation reports
    the draft's loss on them, and it falls as the draft learns."""
    target, _ = trained
    out, cache = tmp_path / "draft", tmp_path / "data.json"
    assert (
        run_train_draft(
            target,
            corpus,
            out,
            "--layers",
            "1",
            "--data-cache",
            str(cache),
            "--val-sequences",
            "6",
            *TINY_DRAFT[:-1],
            "--eval-every",
            "10",
        )
        == 0
    )
    s = json.loads((out / "training.json").read_text())
    n = len(json.loads(cache.read_text())["prompts"])
    assert s["val_sequences"] == 6 and s["sequences"] == n - 6
    vals = [h["val_loss"] for h in s["history"]]
    assert len(vals) >= 2 and s["val_loss"] == vals[-1]
    assert vals[-1] < vals[0], vals


def test_train_target_dropout_trains_and_saves_the_plain_layers(tmp_path, corpus, trained):
    """--dropout changes training (same seed, other losses) but not the saved model's layout:
    mlx-lm loads it and its tensors are named as without dropout."""
    from mlx_lm import load

    out = tmp_path / "t"
    assert main(["train-target", "--out", str(out), "--corpus", str(corpus), *TINY_TARGET, "--dropout", "0.2"]) == 0
    summary = json.loads((out / "training.json").read_text())
    base = json.loads((trained[0] / "training.json").read_text())
    assert summary["dropout"] == 0.2 and base["dropout"] == 0.0
    assert "with residual dropout 0.2" in (out / "README.md").read_text()
    assert summary["final_train_loss"] != base["final_train_loss"]
    assert summary["heldout_loss"] < np.log(summary["vocab"]) - 0.5  # it learned
    names = lambda d: sorted(k for f in d.glob("*.safetensors") for k in mx.load(str(f)))
    assert names(out) == names(trained[0])
    model, _ = load(str(out))
    assert model(mx.array([[1, 2, 3]])).shape == (1, 3, summary["vocab"])


def test_running_out_of_memory_is_one_error_line(tmp_path, capsys, random_dirs, monkeypatch):
    """MLX's allocation failures (CUDA's wording here) end a run with one line naming the options
    that set its size; any other RuntimeError is a bug and keeps its traceback."""
    target, _ = random_dirs["qwen3"]

    def fail(message):
        def train(args, log):
            raise RuntimeError(message)

        return train

    monkeypatch.setattr(train_draft, "train", fail("cudaMallocAsync(&data, size, stream) failed: out of memory"))
    assert main(["train-draft", "--target", str(target), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: out of memory (cudaMallocAsync"), err
    assert "--batch-size" in err[0] and "--anchors" in err[0] and "--gen-batch" in err[0]
    monkeypatch.setattr(train_draft, "train", fail("some other failure"))
    with pytest.raises(RuntimeError, match="some other failure"):
        main(["train-draft", "--target", str(target), "--out", str(tmp_path / "d")])


def test_draft_vocab_ranks_the_targets_tokens_and_keeps_eos():
    responses = [[5, 5, 7, 7, 2], [5, 9]]  # 5 x3, 7 x2, 2 (EOS) and 9 once
    assert draft_vocab(responses, 2, keep={2}) == (5, 7, 2)  # EOS kept beyond the size
    assert draft_vocab(responses, 3, keep=set()) == (5, 7, 2)  # a tie: the lower id first
    assert draft_vocab(responses, 50, keep={3}) == (5, 7, 2, 9, 3)  # only tokens it wrote, + EOS


def test_data_only_writes_a_draft_vocabulary_that_save_draft_keeps(tmp_path, capsys, random_dirs, corpus):
    target, draft_dir = random_dirs["qwen3"]
    out, cache = shutil.copytree(draft_dir, tmp_path / "draft"), tmp_path / "data.json"
    args = ["train-draft", "--target", str(target), "--data", str(corpus), "--out", str(out), "--data-only"]
    assert main([*args, "--data-cache", str(cache), *TINY_DRAFT, "--draft-vocab", "20"]) == 0
    saved = json.loads(cache.read_text())
    vocab = json.loads((out / "draft_vocab.json").read_text())["tokens"]
    assert vocab[:20] == list(draft_vocab(saved["responses"], 20, set()))[:20]
    pair = load_pair(str(target), str(out))
    assert pair.draft.config.draft_vocab == tuple(vocab)
    train_draft.save_draft(pair.draft, tmp_path / "copy")
    assert json.loads((tmp_path / "copy" / "draft_vocab.json").read_text())["tokens"] == vocab
    pair.draft.config = replace(pair.draft.config, draft_vocab=None)
    train_draft.save_draft(pair.draft, tmp_path / "copy")
    assert not (tmp_path / "copy" / "draft_vocab.json").exists()
    assert (
        main([*args[:-2], str(tmp_path / "nothing"), "--data-only", "--data-cache", str(cache), "--draft-vocab", "5"])
        == 2
    )
    assert "has no config.json" in capsys.readouterr().err
