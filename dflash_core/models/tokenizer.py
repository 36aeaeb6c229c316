"""Byte-level BPE tokenizers for the models this project builds (shipped pair, test models), and
the one streaming detokenizer for generated text."""

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"
SPECIALS = [EOS, IM_START, IM_END, MASK]
# A message's trailing whitespace is dropped: the BPE merges a line break with the next line's
# indent ("\n   "), so the models learn a bare "\n" only before an unindented line, and a prompt
# ending in one asks for a new top-level definition rather than the body the user is writing.
# The trained chat turns never end that way (their user part stops before a newline token).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].rstrip() }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_bpe(texts, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out: Path, chat_template: bool = True) -> dict:
    """Write tokenizer.json + tokenizer_config.json; return the special ids."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",  # else transformers 5 guesses a class
        "eos_token": EOS,
        "pad_token": EOS,
        "additional_special_tokens": [IM_START, IM_END, MASK],
        "model_max_length": 1 << 20,
    }
    if chat_template:
        cfg["chat_template"] = CHAT_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return {name: tok.token_to_id(name) for name in SPECIALS}


def chat_ids(tokenizer, messages: list, template_args: dict = None) -> list:
    """Messages through the model's chat template, as token ids. Thinking is off unless
    `template_args` turn it on: the one default for the CLI, the page, the server and the trainer."""
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **{"enable_thinking": False, **(template_args or {})}
    )
    return tokenizer.encode(text, add_special_tokens=False)


def encode_prompt(
    tokenizer, prompt: str, chat_template: bool = True, system_prompt: str = None, template_args: dict = None
) -> list:
    """One prompt as the engines see it: a user turn in the chat template when the model has one
    and `chat_template` asks for it, else the raw text."""
    if chat_template and getattr(tokenizer, "has_chat_template", False):
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return chat_ids(tokenizer, system + [{"role": "user", "content": prompt}], template_args)
    return tokenizer.encode(prompt)


class TextStream:
    """Generated text as it comes: add() returns the text that the new tokens complete, holding
    back a character split over tokens or cycles (decoded as U+FFFD until its last byte arrives);
    finish() returns what is still held back when the run ends. The pieces join to exactly the
    decode of all the tokens (mlx-lm's streaming detokenizers drop a reply's leading space, which
    a completion must keep). New tokens are decoded after the last group of tokens that completed
    text: SentencePiece drops the leading space of a sequence's first token, so new tokens are
    never decoded on their own; the context starts on a character boundary, because a byte-fallback
    decoder turns a whole run of byte tokens into U+FFFD when it starts mid-character; and
    decoding everything per cycle would be quadratic in the length. Stop tokens (EOS) are not text
    and are left out. One per run; the CLI and the server use it."""

    def __init__(self, tokenizer, skip=()):
        self.decode, self.skip = tokenizer.decode, set(skip)
        self.context, self.pending = [], []  # the last tokens that completed text; tokens since

    def add(self, tokens) -> str:
        self.pending += [t for t in tokens if t not in self.skip]
        tail = self._pending_text()
        if tail.endswith("\ufffd"):
            return ""
        self.context, self.pending = self.pending or self.context, []
        return tail

    def finish(self) -> str:
        tail, self.pending = self._pending_text(), []
        return tail

    def _pending_text(self) -> str:
        head, full = self.decode(self.context), self.decode(self.context + self.pending)
        return full[len(head) :] if full.startswith(head) else self.decode(self.pending)
