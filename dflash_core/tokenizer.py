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


class TextStream:
    """Generated text as it comes, through mlx-lm's streaming detokenizer (the one mlx-lm picks
    for the tokenizer: byte-level BPE, SentencePiece, or decoding since the last line break), so
    a character split over tokens or cycles comes out whole once complete, and SentencePiece's
    word-initial spaces survive. The pieces join to the text of all the tokens. Stop tokens (EOS)
    are not text and are left out. One per generation; `tokenizer` is mlx-lm's TokenizerWrapper."""

    def __init__(self, tokenizer, skip=()):
        self.detokenizer = tokenizer.detokenizer  # a fresh, reset copy on each access
        self.skip = set(skip)

    def add(self, tokens) -> str:
        """The text these tokens complete: "" while a character (or a lone space) waits for more."""
        for token in tokens:
            if token not in self.skip:
                self.detokenizer.add_token(token)
        return self.detokenizer.last_segment

    def finish(self) -> str:
        """What was still held back when the generation ended."""
        self.detokenizer.finalize()
        return self.detokenizer.last_segment
