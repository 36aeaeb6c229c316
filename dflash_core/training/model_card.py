"""Model cards (README.md) for the models the trainers write, from their training summaries."""


def _renamed(s: dict) -> str:
    n = s.get("renamed_copies", 0)
    return (
        f" plus {n} renamed cop{'y' if n == 1 else 'ies'} of each (the file's own names swapped for other files' names)"
        if n
        else ""
    )


def _dropout(s: dict) -> str:
    p = s.get("dropout", 0)
    return f" with residual dropout {p:g}" if p else ""


def _kept(s: dict) -> str:
    low = s.get("lowest_heldout_loss")
    if s.get("keep") == "last" and low:
        return f"; final weights kept (lowest held-out loss {low['loss']:.3f} at step {low['step']})"
    return (
        f"; weights of step {s['kept_step']} kept (lowest held-out loss)"
        if s.get("kept_step") != s.get("steps")
        else ""
    )


def target_card(s: dict) -> str:
    c = s["config"]
    arch = (
        "Qwen3 (mlx-lm `qwen3`): attention in every layer"
        if s["arch"] == "qwen3"
        else "Qwen3.5 hybrid (mlx-lm `qwen3_5`): GatedDeltaNet linear attention, full attention "
        f"every {c.get('full_attention_interval', 2)}nd layer"
    )
    return f"""# stdlib target ({s["arch"]})

A small code model trained from scratch by this project on the Python standard library's own
source, so the playground runs with no download. It writes Python-looking code, not good code.

- Architecture: {arch}; {c["num_hidden_layers"]} layers, hidden {c["hidden_size"]}, MLP {c["intermediate_size"]},
  {c["num_attention_heads"]} heads x {c["head_dim"]} ({c["num_key_value_heads"]} KV heads), tied embeddings,
  context {c["max_position_embeddings"]}.
- Parameters: {s["params"] / 1e6:.2f}M, stored in float16 (upcast to float32 on CPU at load).
- Tokenizer: byte-level BPE, {s["vocab"]} tokens, trained on the same files; specials
  `<|endoftext|>` (EOS), `<|im_start|>`, `<|im_end|>` (EOS), `<|mask|>` (reserved for DFlash drafts);
  ChatML template.
- Data: {s["train_files"]} `*.py` files of the Python {s["python"]} standard library (`{s["corpus"]}`,
  test suites excluded){_renamed(s)}, {s["corpus_tokens"]:,} tokens; {s["heldout_files"]} files (1 in 20 by a hash of the
  path) held out. Half the samples are raw {s["seq_len"]}-token windows, half chat turns whose user message is
  1-12 top-level lines of a file and whose reply is the code that follows.
- Training: {s["steps"]} AdamW steps{_dropout(s)}, {s["tokens"]:,} tokens, {s["train_seconds"]} s on {s.get("device", "one NVIDIA H200 (MLX CUDA)")}
  ({s.get("compute_dtype", "float32")} compute), started {s["started"]}. Final train loss {s["final_train_loss"]},
  held-out loss {s["heldout_loss"]} (nats/token){_kept(s)}.
- Reproduce: `{s["command"]}`
- `eval_prompts.json`: prompts cut from the held-out files (`heldout`) and from training files
  (`train`), for measuring acceptance in and out of the training data.
"""


def draft_card(s: dict) -> str:
    hist = ", ".join(f"{h['step']}: {h['tau']}" for h in s["history"])
    share = s.get("distill", 0)
    distilled = f", {share:g} of it against the target's whole next-token distribution" if share else ""
    return f"""# DFlash draft for {s["target"]}

A block-diffusion draft in the public DFlash checkpoint format (`config.json` with
`dflash_config.target_layer_ids` / `mask_token_id`; weights `fc`, `hidden_norm`, `layers.N.*`, `norm`).
It has no embeddings or LM head: it borrows the target's.

- Architecture: {s["layers"]} draft layer(s), block size {s["block_size"]}, reads target layers
  {s["target_layer_ids"]}. Parameters: {s["params"] / 1e6:.2f}M, stored in float16.
- Data: {s["sequences"]} prompts, their continuations regenerated greedily by the target itself
  ({s["response_tokens"]:,} response tokens).
- Training (`dflash_core/training/train_draft.py`): frozen target; batches of {s["batch_size"]} sequences with up to
  {s["anchors"]} anchors each, resampled each step; block `[token@anchor, MASK x (B-1)]`; block-sparse
  attention (context strictly before the anchor, own block bidirectional); loss weights
  exp(-(k-1)/{s["loss_gamma"]:g}){distilled}; AdamW, cosine schedule with warm-up; {s["compute_dtype"]} compute.
  {s["steps"]} steps ({s["epochs_run"]} epochs), {s["train_seconds"]} s (+{s["data_seconds"]} s
  regenerating data) on {s.get("device", "one NVIDIA H200 (MLX CUDA)")}. Loss {s["first_loss"]} -> {s["final_loss"]}.
- Engine acceptance during training (mean tokens per cycle, held-out prompts, step: tau): {hist}.
- Reproduce: `{s["command"]}`
"""
