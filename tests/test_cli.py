"""The command line: mlx-lm's flag names on generate and benchmark, the prompt from stdin, chat
template arguments, streamed text through the one streaming detokenizer, and the playground
launcher's host/port from Gradio's environment variables."""

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from ui_pair import free_port

from dflash_core import playground
from dflash_core.cli import main
from dflash_core.engine.events import CycleEvent, RunSummary
from dflash_core.errors import DFlashError
from dflash_core.models.loading import load_pair
from dflash_core.models.tokenizer import CHAT_TEMPLATE, TextStream

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "def f(x):"
TEXT = "naïve café 中文字 テキスト 😀🚀 the quick brown fox, déjà vu: ünïcödé and   spaces\n\tend"


def cli_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def cli_error(capsys, *argv) -> str:
    code = main(list(argv))
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("loading ")]
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err  # one line, no traceback
    return err[0]


@pytest.fixture(scope="module")
def qwen3(random_dirs):
    return tuple(map(str, random_dirs["qwen3"]))


@pytest.fixture(scope="module")
def qwen3_pair(qwen3):
    return load_pair(*qwen3)


@pytest.fixture(scope="module")
def reference(qwen3_pair):
    """The engine's own tokens for PROMPT as raw text: 12 tokens at block size 4."""
    ids = qwen3_pair.encode(PROMPT, chat_template=False)
    tokens = list(qwen3_pair.dflash(ids, 12, 4))[-1].tokens
    assert len(tokens) == 12  # no EOS first: the token limit is what ends the run
    return tokens


# --- the streaming detokenizer -------------------------------------------------------------


def _tokenizer(scheme: str, out: Path):
    """mlx-lm's TokenizerWrapper over a small tokenizer that splits TEXT's multi-byte characters
    over several tokens: byte-level BPE (GPT-2 style) or SentencePiece with byte fallback (Llama
    style); mlx-lm picks its streaming detokenizer for each from tokenizer.json's decoder."""
    if scheme == "byte-level":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
    else:
        tok = Tokenizer(models.BPE(byte_fallback=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        # only ASCII letters as characters: everything else is spelled in <0xNN> byte tokens
        trainer = trainers.BpeTrainer(
            vocab_size=300,
            limit_alphabet=28,
            show_progress=False,
            initial_alphabet=list("abcdefghijklmnopqrstuvwxyz\u2581"),
            special_tokens=[f"<0x{b:02X}>" for b in range(256)],
        )
    tok.train_from_iterator([TEXT] * 3, trainer)
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return load_tokenizer(out)


@pytest.mark.parametrize("scheme", ["byte-level", "sentencepiece"])
@pytest.mark.parametrize("step", [1, 3, 16])
def test_text_stream_gives_whole_characters_and_the_full_text(tmp_path, scheme, step):
    tokenizer = _tokenizer(scheme, tmp_path / "tok")
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT
    chunks = [ids[i : i + step] for i in range(0, len(ids), step)]
    # the chunks really split characters: decoding each alone (the old per-cycle text) is wrong
    assert "".join(tokenizer.decode(c) for c in chunks) != TEXT
    stream = TextStream(tokenizer)
    pieces = [stream.add(c) for c in chunks] + [stream.finish()]
    assert "".join(pieces) == TEXT
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("scheme", ["byte-level", "sentencepiece"])
def test_text_stream_keeps_a_replys_leading_space(tmp_path, scheme):
    """A completion that starts with a space (" Paris" after "The capital of France is") keeps it:
    the streamed text is exactly the decode, token by token."""
    tokenizer = _tokenizer(scheme, tmp_path / "tok")
    ids = tokenizer.encode("x " + TEXT, add_special_tokens=False)[1:]  # a sequence that starts mid-text
    stream = TextStream(tokenizer)
    assert "".join([stream.add([t]) for t in ids] + [stream.finish()]) == tokenizer.decode(ids)


def _cycle(i: int, committed: list) -> CycleEvent:
    return CycleEvent(
        cycle=i,
        block_size=2,
        staged_token=committed[0],
        drafted=[],
        confidence=[],
        verified=0,
        posterior=[],
        accepted_len=0,
        committed=committed,
        next_staged=0,
        kv_trimmed=0,
        gdn_replayed=0,
        draft_ms=0.0,
        verify_ms=0.0,
        rollback_ms=0.0,
        t=0.0,
    )


def test_generate_prints_characters_split_over_cycles_whole(qwen3_pair, monkeypatch, capsys):
    """The text view prints what the engine commits, cycle by cycle: an emoji whose bytes arrive
    in two cycles comes out once, whole, and the EOS that ends the reply is not printed."""
    from dflash_core.commands import generate

    pair = qwen3_pair
    reply = "Hi 😀, café"
    tokens = pair.tokenizer.encode(reply, add_special_tokens=False) + [min(pair.eos_ids)]
    cycles = [tokens[i : i + 2] for i in range(0, len(tokens), 2)]
    assert any("\ufffd" in pair.tokenizer.decode(c) for c in cycles)  # the script does split characters

    def scripted(ids, max_tokens, block_size=None, min_confidence=None, sampling=None, policy=None, copy=False):
        yield from (_cycle(i, c) for i, c in enumerate(cycles))
        yield RunSummary(
            engine="dflash",
            prompt_tokens=len(ids),
            tokens=tokens,
            prefill_s=0.1,
            decode_s=0.1,
            stop_reason="eos",
            peak_memory_mb=0.0,
            block_size=2,
            cycles=len(cycles),
        )

    monkeypatch.setattr(pair, "dflash", scripted)
    monkeypatch.setattr(generate, "load", lambda args: pair)
    assert main(["generate", "--prompt", "hello"]) == 0
    assert capsys.readouterr().out == reply


# --- mlx-lm's flag names ---------------------------------------------------------------------


def test_mlx_lm_names_give_the_same_run(qwen3, qwen3_pair, reference, capsys):
    t, d = qwen3
    out = cli_json(
        capsys,
        "generate",
        "--model",
        t,
        "--draft-model",
        d,
        "-p",
        PROMPT,
        "-m",
        "12",
        "--num-draft-tokens",
        "3",
        "--ignore-chat-template",
    )
    assert out["tokens"] == reference
    assert out["stats"]["block_size"] == 4
    assert out["stats"]["prompt_tokens"] == len(qwen3_pair.tokenizer.encode(PROMPT))  # raw text


def test_num_draft_tokens_is_checked(qwen3, capsys):
    t, d = qwen3
    base = ["generate", "--model", t, "--draft", d, "--prompt", PROMPT]
    assert "not allowed with argument --block-size" in cli_error(
        capsys, *base, "--block-size", "4", "--num-draft-tokens", "3"
    )
    msg = cli_error(capsys, *base, "--num-draft-tokens", "16")  # the random draft's block size is 16
    assert msg.startswith("error: --num-draft-tokens 16 is out of range: use 1..15")
    assert "too small" in cli_error(capsys, *base, "--num-draft-tokens", "0")


def test_prompt_dash_reads_stdin(qwen3, reference, monkeypatch, capsys):
    t, d = qwen3
    args = [
        "generate",
        "--model",
        t,
        "--draft",
        d,
        "--prompt",
        "-",
        "--max-tokens",
        "12",
        "--block-size",
        "4",
        "--no-chat-template",
    ]
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    assert cli_json(capsys, *args)["tokens"] == reference
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert "the prompt is empty" in cli_error(capsys, *args)


def test_benchmark_takes_mlx_lm_names(qwen3, capsys):
    t, d = qwen3
    out = cli_json(
        capsys,
        "benchmark",
        "--model",
        t,
        "--draft-model",
        d,
        "-p",
        PROMPT,
        "-m",
        "8",
        "--num-draft-tokens",
        "3",
        "--repeat",
        "1",
    )
    assert out["config"]["block_size"] == 4 and out["config"]["max_tokens"] == 8
    assert out["config"]["prompts"] == [PROMPT]


# --- chat template arguments -----------------------------------------------------------------


@pytest.fixture(scope="module")
def thinking_target(qwen3, tmp_path_factory):
    """The random target with a chat template that has a thinking switch, as Qwen3's has."""
    t = shutil.copytree(qwen3[0], tmp_path_factory.mktemp("thinking") / "target")
    cfg = json.loads((t / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE.replace(
        "assistant\n{% endif %}", "assistant\n{% if enable_thinking %}<think>{% endif %}{% endif %}"
    )
    (t / "tokenizer_config.json").write_text(json.dumps(cfg))
    return str(t), qwen3[1]


def test_system_prompt_and_chat_template_args_reach_the_template(thinking_target, capsys):
    t, d = thinking_target
    pair = load_pair(t, d)
    plain = pair.decode(pair.encode("hello"))
    thinking = pair.decode(pair.encode("hello", template_args={"enable_thinking": True}))
    system = pair.decode(pair.encode("hello", system_prompt="Be brief."))
    assert "<think>" not in plain and thinking == plain + "<think>"  # thinking is off unless asked for
    assert system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and system.endswith(plain)

    base = ["generate", "--model", t, "--draft", d, "--prompt", "hello", "--max-tokens", "4"]
    both = cli_json(capsys, *base, "--system-prompt", "Be brief.", "--chat-template-args", '{"enable_thinking": true}')
    expected = pair.encode("hello", system_prompt="Be brief.", template_args={"enable_thinking": True})
    assert both["stats"]["prompt_tokens"] == len(expected) > len(pair.encode("hello"))


def test_bad_chat_template_args_are_one_error_line(qwen3, capsys):
    t, d = qwen3
    base = ["generate", "--model", t, "--draft", d, "--prompt", PROMPT]
    assert "is not valid JSON" in cli_error(capsys, *base, "--chat-template-args", "{enable_thinking: true}")
    assert "is not a JSON object" in cli_error(capsys, *base, "--chat-template-args", "[1]")
    # contradicting --no-chat-template is said before anything loads (this model does not exist)
    msg = cli_error(
        capsys,
        "generate",
        "--model",
        "/no/such/model",
        "--prompt",
        PROMPT,
        "--system-prompt",
        "Be brief.",
        "--no-chat-template",
    )
    assert "go through the chat template: drop --no-chat-template" in msg


# --- the playground launcher -----------------------------------------------------------------


def test_playground_host_and_port_from_gradio_environment(monkeypatch, capsys):
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7999")
    args = playground.parse_args([])
    assert (args.host, args.port) == ("0.0.0.0", 7999)
    args = playground.parse_args(["--host", "127.0.0.1", "--port", "8001"])  # flags win
    assert (args.host, args.port) == ("127.0.0.1", 8001)
    monkeypatch.delenv("GRADIO_SERVER_NAME")
    monkeypatch.delenv("GRADIO_SERVER_PORT")
    args = playground.parse_args([])
    assert (args.host, args.port) == (playground.DEFAULT_HOST, playground.DEFAULT_PORT)
    monkeypatch.setenv("GRADIO_SERVER_PORT", "http")
    with pytest.raises(DFlashError, match="GRADIO_SERVER_PORT: 'http' is not a whole number"):
        playground.parse_args([])


@pytest.mark.slow
@pytest.mark.parametrize(
    "flag, value, problem",
    [
        ("--port", "0", "0 is not a port: give a whole number 1..65535"),
        ("--port", "seven", "'seven' is not a whole number"),
        ("--max-tokens-cap", "0", "0 is too small: give a whole number >= 1"),
        ("--concurrency", "-1", "-1 is too small: give a whole number >= 1"),
        ("--queue-size", "many", "'many' is not a whole number"),
    ],
)
def test_playground_numeric_flags_are_checked(flag, value, problem):
    bad = subprocess.run([sys.executable, "app.py", flag, value], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [f"error: argument {flag}: {problem} (see `python app.py --help`)"]


@pytest.mark.slow
def test_app_serves_on_the_port_gradio_server_port_names(qwen3):
    t, d = qwen3
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--model", t, "--draft", d, "--no-browser"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    page = None
    try:
        deadline = time.time() + 180
        while page is None and time.time() < deadline and proc.poll() is None:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
            except httpx.TransportError:
                time.sleep(1)
        assert proc.poll() is None, proc.stderr.read()
        assert page is not None and page.status_code == 200 and "gradio" in page.text.lower()
    finally:
        proc.terminate()
        proc.wait(20)
