"""The playground page: Gradio Blocks over the engine's events (ui/runner.py collects them,
ui/render.py and ui/charts.py draw them). No engine logic here."""

import json
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gradio as gr

from dflash_core.backend import default_min_confidence
from dflash_core.benchmark import recorded_figure
from dflash_core.engine.policy import POLICIES
from dflash_core.engine.sampling import Sampling
from dflash_core.errors import DFlashError
from dflash_core.models.memory import device_memory, gb
from dflash_core.models.registry import ASSETS as SHIPPED_DIR
from dflash_core.serving.worker import default_worker

from . import assets, charts, render
from .models import Catalogue
from .runner import Comparison, compare

PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "examples.json"
# While an engine is being timed the page does not change: the handler runs in the same process
# as the engine, and the browser on the same cores, so any page update is time taken from the run
# it measures (measured on two cores, even two light updates a second slowed DFlash's draft phase
# by ~10%: docs/benchmarks.md). Each engine's text appears when it has finished; the race replay
# then plays both back on one clock from their timestamps.
SETTLE_S = 0.5  # after a stage change, before the next engine starts: the browser draws in between
MAX_TEMPERATURE = 1.5
KEEP_EXPORTS = 200  # run files kept for download on a long-running host
MAX_REJECTED_SHOWN = 4  # rejected drafts shown per cycle in the colored pane (the rest as "+N")
# the draft's precision choices: its linear layers quantized at load (nn.quantize), or as stored
FULL_PRECISION = "as stored"
DRAFT_PRECISIONS = {FULL_PRECISION: None, "8-bit": 8, "4-bit": 4}

ABOUT = """
**How DFlash works.** A small *draft* model proposes a whole block of tokens in one forward pass
(it fills `[staged, MASK × (B−1)]` at once, by block diffusion). The big *target* model checks the
block in one forward pass and keeps the longest prefix it agrees with, plus its own next token.
Every kept token is the target's own greedy choice, so the output is **identical** to plain
decoding — just fewer target passes.

**Sampling (temperature above 0).** The draft samples each proposal d from its distribution q;
the target's pass gives its own p. Left to right, d is kept with probability min(1, p(d)/q(d));
at the first rejection the replacement is drawn from max(0, p − q), renormalized, and when all are
kept the next token is drawn from p. The text then follows the target's own sampling distribution
exactly, as plain sampling would, though with a seed it is not the same text.

**What you see.** The baseline runs first, alone; then DFlash runs alone on the same device
(never at the same time). The race replays both on one clock from their recorded timestamps.
In the DFlash pane, each cycle is one group: the <span class="tok tok-target">staged</span> token
the target chose, the <span class="tok tok-accepted">accepted</span> draft tokens, then the
<span class="tok tok-rejected">rejected</span> draft tokens after the first disagreement
(and, on a CPU, <span class="tok tok-unverified">unverified</span> ones: guesses the draft was unsure of,
which the target does not check).
Acceptance rate here is accepted draft tokens ÷ verified draft tokens; tokens/cycle counts the staged token.

**The verification policy.** *Adaptive* (the default) decides every cycle, from a cost model
measured on this device and the draft's acceptance so far, whether drafting pays at all and how
many of the draft's guesses to verify. When drafting does not pay it takes a
<span class="cycle plain-step"><span class="tok tok-target tok-plain">plain step</span></span>: no
draft forward, the target checks only the staged token, exactly one step of plain decoding. So
where the draft does not pay, DFlash decodes at about plain decoding's speed, and now and then it
drafts again to see whether the text has become predictable. *Fixed* verifies the draft's confident
prefix of every block (the verify threshold) and never steps plainly. The cycle inspector shows
each decision, its reason, and its predicted against its measured cost in one-token steps.
"""


def example_prompts() -> list:
    try:
        return json.loads(PROMPTS.read_text())
    except (OSError, json.JSONDecodeError):
        return ["What is the capital of France?"]


class Playground:
    """Per-process state shared by all visitors: the catalogue of pairs, the MLX worker, and
    one Stop flag per browser session."""

    def __init__(self, catalogue: Catalogue, worker, max_tokens_cap: int):
        self.catalogue = catalogue
        self.worker = worker
        self.max_tokens_cap = max_tokens_cap
        self.stops = {}  # session hash -> threading.Event of its running request
        self.export_dir = Path(tempfile.mkdtemp(prefix="dflash-playground-"))
        self.ui = {}  # component name -> component, filled by build_app

    # --- model picker -------------------------------------------------------------------
    def pair_info(self, key: str, draft_quant: int = None) -> str:
        pair = self.catalogue.get(key, draft_quant)
        t = pair.target
        kind = "hybrid (GatedDeltaNet + attention)" if t.hybrid else "attention"
        vocab = f", proposes from {len(pair.draft_vocab):,} tokens" if pair.draft_vocab else ""
        info = render.info_html(
            f"{pair.name}: target {t.num_layers} layers, {kind}, {gb(pair.memory()['target'])}; draft "
            f"{pair.draft.config.num_hidden_layers} layers, {pair.draft_precision()}{vocab}, block size {pair.block_size}; "
            f"context {pair.context_length} tokens"
        )
        warning = pair.fit_warning()
        return info + (render.warning_html(warning) if warning else "")

    def limits(self, key: str):
        pair = self.catalogue.loaded(key) or self.catalogue.get(key)
        return pair.block_size, min(self.max_tokens_cap, pair.context_length - 1)

    def download_offer(self, plan, draft_quant: int = None) -> str:
        """What a pair not yet in the cache will download and take in memory, before anything
        large is fetched (the hub's file listing; its configs are already read and checked)."""
        parts, estimate, warning = plan.notice(draft_quant)
        need = (
            f" Loaded, it takes about {gb(estimate)} of this device's {gb(device_memory()['working_set'])} working set."
            if estimate
            else ""
        )
        info = render.info_html(
            f"{plan.name} is not downloaded yet ({'; '.join(parts)}); it goes into the "
            f"Hugging Face cache.{need} Press Download to go on."
        )
        return info + (render.warning_html(warning) if warning else "")

    def select_model(self, key, block_size, max_tokens, draft_quant=FULL_PRECISION, progress=gr.Progress()):
        """Load the picked pair and fit the form to it; a hub pair not in the cache yet only shows
        its size and the Download button (download() fetches it)."""
        skip = (gr.skip(),) * 5
        if not key:
            return (render.error_html("pick a model"), *skip)
        bits = DRAFT_PRECISIONS.get(draft_quant)
        try:
            plan = self.catalogue.pending_download(key)
            if plan is not None and not plan.can_download():
                self.catalogue.download(key)  # offline: says what is missing from the cache
            if plan is not None:
                offer = self.download_offer(plan, bits)
                return (offer, gr.skip(), gr.skip(), gr.skip(), gr.Button(visible=True), gr.skip())
            progress(0.1, desc=f"loading {key}" if not self.catalogue.is_loaded(key, bits) else "ready")
            info = self.pair_info(key, bits)
            B, cap = self.limits(key)
        except DFlashError as e:
            return (render.error_html(str(e)), *skip)
        progress(1.0)
        pair = self.catalogue.get(key, bits)
        return (
            info,
            gr.Slider(minimum=2, maximum=B, value=min(int(block_size or B), B), step=1),
            gr.Slider(minimum=1, maximum=cap, value=min(int(max_tokens or cap), cap), step=1),
            gr.Checkbox(value=pair.chat_default),
            gr.Button(visible=False),
            gr.Checkbox(visible=pair.thinking_switch, value=False),
        )

    def download(self, key, block_size, max_tokens, draft_quant=FULL_PRECISION, progress=gr.Progress(track_tqdm=True)):
        """Download the picked pair (the draft first), the hub's progress bars on the page, then load it."""
        try:
            plan = self.catalogue.pending_download(key)
            if plan is not None:
                self.catalogue.download(key, log=lambda message: progress(0, desc=message))
        except DFlashError as e:
            return (render.error_html(str(e)), *(gr.skip(),) * 5)
        return self.select_model(key, block_size, max_tokens, draft_quant, progress)

    # --- permalink ----------------------------------------------------------------------
    def prefill(self, key, request: gr.Request):
        """Fill the form from ?prompt=...&max_tokens=...&block_size=...&chat=...&policy=...
        &min_confidence=...&temperature=...&top_p=...&seed=...&thinking=... A link without a policy
        but with a min_confidence (made before the adaptive policy) asks for the fixed one."""
        q = dict(request.query_params) if request else {}
        try:
            loaded = self.catalogue.loaded(key) if key else None  # at the precision it was loaded at
            info = (
                self.pair_info(key, loaded.draft_quant if loaded else None)
                if key
                else render.error_html("no model pairs are available on this host")
            )
            B, cap = self.limits(key) if key else (16, self.max_tokens_cap)
        except DFlashError as e:
            info, (B, cap) = render.error_html(str(e)), (16, self.max_tokens_cap)

        def number(name, default, lo, hi, kind=int):
            try:
                return max(lo, min(hi, kind(q.get(name, default))))
            except ValueError:
                return default

        policy = policy_of_query(q)
        return (
            q.get("prompt", example_prompts()[0]),
            number("max_tokens", min(128, cap), 1, cap),
            number("block_size", B, 2, B),
            q.get("chat", "0") in ("1", "true", "yes") if "chat" in q else self.catalogue.is_chat(key),
            policy,
            gr.Slider(
                value=number("min_confidence", default_min_confidence(), 0.0, 1.0, float),
                interactive=policy == "fixed",
            ),
            number("temperature", 0.0, 0.0, MAX_TEMPERATURE, float),
            number("top_p", 1.0, 0.05, 1.0, float),
            number("seed", 0, 0, 2**31 - 1),
            info,
            gr.Checkbox(value=q.get("thinking") in ("1", "true", "yes"), visible=self.thinking_switch(key)),
        )

    def thinking_switch(self, key) -> bool:
        pair = self.catalogue.loaded(key) if key else None
        return pair is not None and pair.thinking_switch

    def export(self, run: Comparison) -> Path:
        """The run as JSON (events + summaries) for the download button; old files are pruned."""
        path = self.export_dir / f"dflash-run-{time.time_ns()}.json"
        path.write_text(json.dumps(run.to_json(), indent=1))
        for old in sorted(self.export_dir.glob("dflash-run-*.json"))[:-KEEP_EXPORTS]:
            old.unlink(missing_ok=True)
        return path

    # --- the run --------------------------------------------------------------------------
    def stop(self, request: gr.Request):
        event = self.stops.get(request.session_hash) if request else None
        if event is not None:
            event.set()

    def run(
        self,
        prompt,
        key,
        max_tokens,
        block_size,
        chat,
        min_confidence,
        temperature=0.0,
        top_p=1.0,
        seed=0,
        thinking=False,
        draft_quant=FULL_PRECISION,
        policy="adaptive",
        request: gr.Request = None,
    ):
        """Baseline, then DFlash, then the lossless check, streamed to the page. Temperature 0 is
        greedy; above it, plain sampling against speculative sampling with the same seed. Thinking
        turns on the chat template's thinking mode where it has one; draft_quant is the draft's
        precision (DRAFT_PRECISIONS); policy is DFlash's verification policy (POLICIES), and
        min_confidence applies to the fixed one alone. policy comes last, so that callers of the
        API from before it keep their positions (and get the adaptive policy)."""
        ui = self.ui
        try:
            # the sliders' bounds (Gradio checks them) hold the host's cap and the draft's block size
            max_tokens, block_size = int(max_tokens), int(block_size)
            if draft_quant not in DRAFT_PRECISIONS:
                raise DFlashError(f"draft precision '{draft_quant}' is not one of {', '.join(DRAFT_PRECISIONS)}")
            if policy not in POLICIES:
                raise DFlashError(f"policy '{policy}' is not one of {', '.join(POLICIES)}")
            bits = DRAFT_PRECISIONS[draft_quant]
            if not self.catalogue.is_loaded(key, bits):
                yield {ui["status"]: render.info_html(f"loading {key} …")}
            pair = self.catalogue.get(key, bits)
            thinking = bool(thinking) and bool(chat) and pair.thinking_switch
            ids = self.worker.call(
                pair.encode, prompt or "", bool(chat), template_args={"enable_thinking": True} if thinking else None
            )
        except DFlashError as e:
            yield {ui["status"]: render.error_html(str(e))}
            return
        user_stop = threading.Event()
        session = request.session_hash if request else "local"
        self.stops[session] = user_stop
        run = Comparison(
            pair.name,
            prompt,
            ids,
            max_tokens,
            block_size,
            bool(chat),
            hybrid=pair.target.hybrid,
            min_confidence=float(min_confidence),
            policy=policy,
            sampling=Sampling(float(temperature), float(top_p), int(seed)) if float(temperature or 0) > 0 else None,
            thinking=thinking,
            draft_quant=bits,
        )
        view = RunView(pair)
        yield {**view.reset(ui), ui["status"]: render.info_html(f"prompt: {len(ids)} tokens · running the baseline …")}
        shown = {}
        try:
            for _ in compare(self.worker, pair, run, user_stop):  # fills `run` event by event
                if view.stage == run.stage:
                    continue  # an engine is being timed: the page waits for the next stage
                # only the panes that changed go to the browser
                frame = {k: v for k, v in view.frame(ui, run).items() if shown.get(k) != v}
                shown.update(frame)
                yield frame
                if run.stage in ("baseline", "dflash") and not user_stop.is_set():
                    time.sleep(SETTLE_S)  # compare() starts the engine when resumed
        except DFlashError as e:
            yield {ui["status"]: render.error_html(str(e))}
            return
        except Exception as e:  # a bug or a device error: say so on the page, keep serving
            traceback.print_exc()
            yield {
                ui["status"]: render.error_html(
                    f"internal error ({type(e).__name__}: {e}); the details are in the server log"
                )
            }
            return
        finally:
            self.stops.pop(session, None)
        path = self.export(run)
        yield {**view.frame(ui, run), **view.charts(ui, run), **view.finish(ui, run, path)}

    @staticmethod
    def inspect(shown: "Shown", index):
        if shown is None or not shown.run.cycles:
            return render.info_html("run a prompt, then step through its cycles here")
        i = max(0, min(int(index or 0), len(shown.run.cycles) - 1))
        run = shown.run
        return render.inspector_html(run.cycles[i], shown.token_text, hybrid=run.hybrid, policy=run.policy)

    @staticmethod
    def redraw_tokens(shown: "Shown", all_rejected: bool):
        if shown is None:
            return gr.skip()
        limit = None if all_rejected else MAX_REJECTED_SHOWN
        return render.dflash_tokens_html(shown.run.cycles, shown.pieces, shown.token_text, limit)


def policy_of_query(q: dict) -> str:
    """The policy a link asks for: its ?policy= when that is one, else fixed for a link that
    sets min_confidence (links from before the adaptive policy always did), else adaptive."""
    if q.get("policy") in POLICIES:
        return q["policy"]
    return "fixed" if "min_confidence" in q else "adaptive"


def _stats(summary, running: bool, extra: list = ()) -> str:
    """An engine's figures once it has finished (its RunSummary), else what it is doing."""
    if summary is None:
        return render.stats_html(0, 0.0, 0.0, extra, status="running" if running else "waiting")
    elapsed = summary.prefill_s + summary.decode_s
    return render.stats_html(
        summary.generated, elapsed, summary.decode_tps, extra, status=summary.stop_reason.replace("_", " ")
    )


def _pending_text(running: bool) -> str:
    return "Running alone; the text appears when it finishes." if running else "Output appears here."


def single_token_text(tokenizer):
    """Decodes one token on its own (draft proposals, inspector cells); cached per run."""

    @lru_cache(maxsize=8192)
    def text(tok: int) -> str:
        return tokenizer.decode([tok])

    return text


@dataclass
class Shown:
    """What a session keeps of its last run (gr.State): enough to redraw and inspect it. It holds
    the tokenizer, not the Pair, so a session never keeps an unloaded model alive."""

    run: Comparison
    token_text: object
    pieces: list  # texts of the DFlash committed tokens


class RunView:
    """Turns a Comparison into component updates; keeps incremental token texts between frames."""

    def __init__(self, pair):
        self.stage = None
        self.token_text = single_token_text(pair.tokenizer)
        self.baseline_pieces = render.Pieces(pair.tokenizer.decode)
        self.dflash_pieces = render.Pieces(pair.tokenizer.decode)
        self.b_text, self.d_pieces = [], []
        self.recorded = recorded_figure(pair.draft_dir)

    def reset(self, ui) -> dict:
        empty = charts.all_charts([], None, [], None)
        return {
            ui["b_stats"]: render.stats_html(0, 0.0, 0.0, status="waiting"),
            ui["b_out"]: render.plain_text_html("", placeholder="Baseline output appears here."),
            ui["d_stats"]: render.stats_html(0, 0.0, 0.0, render.dflash_extra(), status="waiting"),
            ui["d_out"]: render.dflash_tokens_html([], [], self.token_text),
            ui["speedup"]: render.speedup_html(recorded=self.recorded),
            ui["lossless"]: render.lossless_html("pending"),
            ui["race"]: render.info_html("The race replay starts when both engines have finished."),
            **{p: fig for p, fig in zip(ui["plots"], empty)},
            ui["insp_html"]: render.info_html("run a prompt, then step through its cycles here"),
            ui["export"]: gr.DownloadButton(value=None, interactive=False),
        }

    def _sync(self, run: Comparison):
        """Bring the decoded pieces up to date with the events."""
        new_b = [e.token for e in run.baseline[len(self.b_text) :]]
        self.b_text += self.baseline_pieces.add(new_b)
        new_d = run.dflash_tokens()[len(self.d_pieces) :]
        self.d_pieces += self.dflash_pieces.add(new_d)

    def frame(self, ui, run: Comparison) -> dict:
        """The page at a stage change: a finished engine's text and figures, a running one's
        placeholder (its text would cost it time while it is timed)."""
        self._sync(run)
        self.stage = run.stage
        b, d = run.baseline_summary, run.dflash_summary
        status = {
            "baseline": "running the baseline (plain greedy decoding) alone; its text appears when it finishes …",
            "dflash": "running DFlash alone on the same device; its text appears when it finishes …",
            "check": "comparing the two outputs token by token …",
            "done": "stopped: the text so far is kept" if run.stopped or run.verdict == "partial" else "done",
        }[run.stage]
        policy = render.policy_summary(d) if run.stage in ("check", "done") else ""
        status += f" · {policy}" if policy else ""
        return {
            ui["status"]: render.info_html(status),
            ui["b_stats"]: _stats(b, run.stage == "baseline"),
            ui["b_out"]: render.plain_text_html(
                "".join(self.b_text), placeholder=_pending_text(run.stage == "baseline")
            ),
            ui["d_stats"]: _stats(d, run.stage == "dflash", render.dflash_extra(d.tally if d else None, run.policy)),
            ui["d_out"]: render.plain_text_html("", placeholder=_pending_text(True))
            if run.stage == "dflash"
            else render.dflash_tokens_html(run.cycles, self.d_pieces, self.token_text, MAX_REJECTED_SHOWN),
        }

    def charts(self, ui, run: Comparison) -> dict:
        figs = charts.all_charts(run.baseline, run.baseline_summary, run.cycles, run.dflash_summary)
        return dict(zip(ui["plots"], figs))

    def finish(self, ui, run: Comparison, export_path: Path) -> dict:
        b, d = run.baseline_summary, run.dflash_summary
        out = {
            ui["export"]: gr.DownloadButton(value=str(export_path), interactive=True),
            ui["state"]: Shown(run, self.token_text, self.d_pieces),
        }
        if run.verdict == "identical":
            out[ui["lossless"]] = render.lossless_html(
                "identical", f"all {len(d.tokens)} tokens match the baseline token for token"
            )
        elif run.verdict == "sampled":
            s = run.sampling
            out[ui["lossless"]] = render.lossless_html(
                "sampled",
                f"temperature {s.temperature:g}, top-p {s.top_p:g}, seed {s.seed}: speculative sampling "
                "keeps the target's own distribution, so DFlash and plain sampling write different texts from "
                "the same distribution (temperature 0 gives token-for-token identity)"
                + (
                    "; under the adaptive policy the same seed need not repeat DFlash's text (its choices "
                    "follow measured time): the fixed policy repeats it"
                    if run.policy == "adaptive"
                    else ""
                ),
            )
        elif run.verdict == "diverged":
            out[ui["lossless"]] = render.lossless_html(
                "diverged", render.divergence_detail(run.divergence, self.token_text)
            )
        elif d is None:
            out[ui["lossless"]] = render.lossless_html("partial", "stopped before DFlash ran")
        else:
            k = min(len(d.tokens), len(b.tokens))
            out[ui["lossless"]] = render.lossless_html("partial", f"stopped early; the first {k} tokens are identical")
        if d is None:
            return out
        out[ui["speedup"]] = render.speedup_html(b, d, self.recorded)
        b_times = [b.prefill_s + e.t for e in run.baseline]
        d_times = [d.prefill_s + c.t for c in run.cycles for _ in c.committed]
        end = max(b_times[-1:] + d_times[-1:] or [0.0])
        speed = end / min(max(end, 3.0), 12.0) if end else 1.0  # replays last 3 to 12 seconds
        out[ui["race"]] = render.race_html(self.b_text, b_times, self.d_pieces, d_times, round(speed, 3))
        first = next((c.cycle for c in run.cycles if 0 < c.accepted_len < c.block_size - 1), 0)
        out[ui["insp_slider"]] = gr.Slider(minimum=0, maximum=max(len(run.cycles) - 1, 1), value=first, step=1)
        out[ui["insp_html"]] = render.inspector_html(
            run.cycles[first], self.token_text, hybrid=run.hybrid, policy=run.policy
        )
        return out


def build_app(
    model: str = None,
    draft: str = None,
    allow_downloads: bool = False,
    max_tokens_cap: int = 512,
    concurrency: int = 1,
    queue_size: int = 32,
    worker=None,
    pair=None,
):
    """The playground as (gr.Blocks, launch_kwargs). launch_kwargs (theme, css) go to
    `blocks.launch(**launch_kwargs)` or `gr.mount_gradio_app(app, blocks, path, **launch_kwargs)`.

    model/draft: the host's pair, offered first (a shipped pair's name, local directories or hub
    ids; draft None = the shipped pair / the registry's draft); none = the shipped default pair.
    allow_downloads: also offer the registered hub pairs to visitors. worker: the MLX worker
    (default: dflash_core.worker.default_worker()). pair: an already loaded Pair for model/draft,
    so a server that loaded it does not load it twice."""
    worker = worker or default_worker()
    catalogue = Catalogue(worker, [(model, draft)] if model else [], allow_downloads)
    if pair is not None and model:
        catalogue.add_loaded(catalogue.key_of(model, draft), pair)
    play = Playground(catalogue, worker, max_tokens_cap)
    default = catalogue.default_key()
    if default is None:
        raise DFlashError(
            f"no model pair to serve: the shipped pairs are missing from {SHIPPED_DIR} "
            "(is this a full clone?); give one with --model DIR --draft DIR"
        )
    try:
        warning = catalogue.get(default).fit_warning()  # load before the first visitor arrives
        if warning:
            print(f"warning: {warning}")  # the page shows it too
    except DFlashError as e:
        print(f"warning: could not load {default}: {e}")  # the page shows it as a panel too

    with gr.Blocks(title="DFlash playground") as demo:
        ui = play.ui
        with gr.Row(equal_height=False):
            gr.HTML(
                "<h1>DFlash playground</h1><p>Block-diffusion speculative decoding on MLX: a small draft "
                "proposes a block of tokens in one pass, the target verifies them in one pass. Same "
                "output as plain greedy decoding, fewer target passes.</p>",
                elem_id="title",
            )
            theme_btn = gr.Button(
                "◐ Light / dark", size="sm", elem_id="theme-toggle", variant="secondary", scale=0, min_width=130
            )
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(
                    label="Prompt",
                    lines=7,
                    max_lines=16,
                    elem_id="prompt",
                    placeholder="Ask something, e.g. Explain how a rainbow forms.",
                )
                gr.Examples(example_prompts(), inputs=[prompt], label="Examples")
                link = gr.Textbox(
                    label="Link to these settings (Copy link fills it)",
                    interactive=False,
                    elem_id="permalink",
                    max_lines=1,
                    buttons=["copy"],
                )
            with gr.Column(scale=2):
                model_key = gr.Dropdown(catalogue.choices(), value=default, label="Model pair", elem_id="model")
                model_info = gr.HTML(elem_id="model-info")
                download_btn = gr.Button("Download", variant="secondary", visible=False, elem_id="download")
                loaded = catalogue.loaded(default)  # a server's pair may come with a quantized draft
                bits0 = loaded.draft_quant if loaded is not None else None
                draft_quant = gr.Radio(
                    list(DRAFT_PRECISIONS),
                    label="Draft precision",
                    value=next(k for k, bits in DRAFT_PRECISIONS.items() if bits == bits0),
                    info="quantize the draft's linear layers at load: less memory, the same "
                    "output (the target checks every token); acceptance may change",
                    elem_id="draft-quant",
                )
                B0, cap0 = play.limits(default) if loaded is not None else (16, max_tokens_cap)
                max_tokens = gr.Slider(
                    1,
                    cap0,
                    value=min(128, cap0),
                    step=1,
                    label="Max new tokens",
                    info=f"capped at {max_tokens_cap} on this host",
                    elem_id="max-tokens",
                )
                block_size = gr.Slider(
                    2,
                    B0,
                    value=B0,
                    step=1,
                    label="Block size",
                    info="tokens per block: staged + drafts (up to the draft's trained size)",
                    elem_id="block-size",
                )
                policy = gr.Radio(
                    list(POLICIES),
                    value="adaptive",
                    label="Verification policy",
                    info="adaptive: each cycle a measured cost model picks a plain target step or a draft, "
                    "and how many guesses to verify; fixed: verify the draft's confident prefix (the threshold below)",
                    elem_id="policy",
                )
                min_confidence = gr.Slider(
                    0,
                    1,
                    value=default_min_confidence(),
                    step=0.05,
                    label="Verify threshold (draft confidence)",
                    info="fixed policy only: the target checks only the leading guesses the draft gives at "
                    "least this probability (the first always); 0 checks all",
                    interactive=False,  # the adaptive policy's until the policy is fixed
                    elem_id="min-confidence",
                )
                chat = gr.Checkbox(catalogue.is_chat(default), label="Apply the chat template", elem_id="chat-template")
                thinking = gr.Checkbox(
                    False,
                    label="Thinking (the model reasons first, in its chat template's thinking mode)",
                    visible=play.thinking_switch(default),
                    elem_id="thinking",
                )
                with gr.Accordion("Sampling (temperature 0: greedy)", open=False):
                    temperature = gr.Slider(
                        0,
                        MAX_TEMPERATURE,
                        value=0,
                        step=0.05,
                        label="Temperature",
                        info="above 0 both engines sample: plain sampling against speculative "
                        "sampling, which keeps the target's distribution",
                        elem_id="temperature",
                    )
                    top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p", elem_id="top-p")
                    seed = gr.Number(0, label="Seed", precision=0, minimum=0, elem_id="seed")
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="run", scale=2)
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop", scale=1)
                with gr.Row():
                    link_btn = gr.Button("Copy link", size="sm", elem_id="copy-link")
                    ui["export"] = gr.DownloadButton(
                        "Download run (JSON)", size="sm", interactive=False, elem_id="export"
                    )
        ui["status"] = gr.HTML(elem_id="status-panel")
        with gr.Row(equal_height=True):
            with gr.Column(scale=1, min_width=220):
                ui["speedup"] = gr.HTML(render.speedup_html(), elem_id="speedup")
            with gr.Column(scale=3):
                ui["lossless"] = gr.HTML(render.lossless_html("pending"), elem_id="lossless")
        with gr.Row(equal_height=False):
            with gr.Column():
                gr.HTML(
                    '<div class="pane-title"><span class="dot" style="background:#8b93a7"></span>'
                    "Baseline · plain decoding (greedy; sampling above temperature 0)</div>"
                )
                ui["b_stats"] = gr.HTML(render.stats_html(0, 0.0, 0.0), elem_id="baseline-stats")
                ui["b_out"] = gr.HTML(
                    render.plain_text_html("", placeholder="Baseline output appears here."), elem_id="baseline-output"
                )
            with gr.Column():
                gr.HTML(
                    '<div class="pane-title"><span class="dot" style="background:#6366f1"></span>'
                    "DFlash · draft a block, verify in one pass</div>"
                )
                ui["d_stats"] = gr.HTML(render.stats_html(0, 0.0, 0.0, render.dflash_extra()), elem_id="dflash-stats")
                ui["d_out"] = gr.HTML(render.dflash_tokens_html([], [], str), elem_id="dflash-tokens")
                gr.HTML(render.LEGEND)
                all_rejected = gr.Checkbox(
                    False,
                    label=f"Show every rejected draft token (else the first {MAX_REJECTED_SHOWN} per cycle)",
                    elem_id="all-rejected",
                )
        with gr.Accordion("Race replay: both engines on one clock", open=True):
            ui["race"] = gr.HTML(
                render.info_html("The race replay starts when both engines have finished."), elem_id="race"
            )
            replay_btn = gr.Button("Replay race", size="sm", elem_id="replay")
        with gr.Accordion("Charts", open=True):
            with gr.Row():
                ui["plots"] = [gr.Plot(show_label=False, elem_classes="chart") for _ in range(2)]
            with gr.Row():
                ui["plots"] += [gr.Plot(show_label=False, elem_classes="chart") for _ in range(2)]
            with gr.Row():
                ui["plots"] += [gr.Plot(show_label=False, elem_classes="chart") for _ in range(2)]
        with gr.Accordion("Cycle inspector: step through the cycles", open=True):
            with gr.Row():
                prev_btn = gr.Button("◀ Prev", size="sm", scale=0, min_width=90)
                ui["insp_slider"] = gr.Slider(0, 1, value=0, step=1, label="Cycle", elem_id="cycle-slider", scale=4)
                next_btn = gr.Button("Next ▶", size="sm", scale=0, min_width=90)
            ui["insp_html"] = gr.HTML(
                render.info_html("run a prompt, then step through its cycles here"), elem_id="inspector"
            )
        with gr.Accordion("How it works", open=False):
            gr.Markdown(ABOUT)
        ui["state"] = gr.State(None)

        outputs = [
            ui["status"],
            ui["b_stats"],
            ui["b_out"],
            ui["d_stats"],
            ui["d_out"],
            ui["speedup"],
            ui["lossless"],
            ui["race"],
            *ui["plots"],
            ui["insp_slider"],
            ui["insp_html"],
            ui["export"],
            ui["state"],
        ]
        run_inputs = [
            prompt,
            model_key,
            max_tokens,
            block_size,
            chat,
            min_confidence,
            temperature,
            top_p,
            seed,
            thinking,
            draft_quant,
            policy,  # last: the API's positions from before the policy stay
        ]
        run_event = run_btn.click(
            play.run,
            run_inputs,
            outputs,
            concurrency_limit=concurrency,
            concurrency_id="mlx",
            show_progress="hidden",
            api_name="run",
        )
        run_event.then(None, js=assets.RACE_JS)
        run_event.then(
            lambda shown, every: play.redraw_tokens(shown, True) if every else gr.skip(),
            [ui["state"], all_rejected],
            [ui["d_out"]],
            queue=False,
            show_progress="hidden",
            api_visibility="private",
        )
        stop_btn.click(play.stop, None, None, queue=False, api_name="stop")
        replay_btn.click(None, js=assets.RACE_JS)
        theme_btn.click(None, js=assets.THEME_JS)
        link_btn.click(
            None,
            [prompt, max_tokens, block_size, chat, policy, min_confidence, temperature, top_p, seed, thinking],
            [link],
            js=assets.COPY_LINK_JS,
        )
        policy.change(
            lambda p: gr.Slider(interactive=p == "fixed"),
            [policy],
            [min_confidence],
            queue=False,
            show_progress="hidden",
            api_visibility="private",
        )
        picker_inputs = [model_key, block_size, max_tokens, draft_quant]
        picker_outputs = [model_info, block_size, max_tokens, chat, download_btn, thinking]
        model_key.change(
            play.select_model,
            picker_inputs,
            picker_outputs,
            concurrency_id="mlx",
            show_progress_on=[model_info],
            api_name="select_model",
        )
        draft_quant.change(
            play.select_model,
            picker_inputs,
            picker_outputs,
            concurrency_id="mlx",
            show_progress_on=[model_info],
            api_visibility="private",
        )
        download_btn.click(
            play.download,
            picker_inputs,
            picker_outputs,
            concurrency_id="mlx",
            show_progress_on=[model_info],
            api_name="download",
        )
        all_rejected.change(
            play.redraw_tokens,
            [ui["state"], all_rejected],
            [ui["d_out"]],
            queue=False,
            show_progress="hidden",
            api_visibility="private",
        )
        ui["insp_slider"].change(
            play.inspect,
            [ui["state"], ui["insp_slider"]],
            [ui["insp_html"]],
            show_progress="hidden",
            queue=False,
            api_visibility="private",
        )
        prev_btn.click(
            lambda i: max(int(i) - 1, 0),
            [ui["insp_slider"]],
            [ui["insp_slider"]],
            queue=False,
            api_visibility="private",
        )
        next_btn.click(
            lambda shown, i: min(int(i) + 1, max(len(shown.run.cycles) - 1, 0)) if shown else 0,
            [ui["state"], ui["insp_slider"]],
            [ui["insp_slider"]],
            queue=False,
            api_visibility="private",
        )
        demo.load(
            play.prefill,
            [model_key],
            [
                prompt,
                max_tokens,
                block_size,
                chat,
                policy,
                min_confidence,
                temperature,
                top_p,
                seed,
                model_info,
                thinking,
            ],
            api_visibility="private",
        )
    demo.queue(default_concurrency_limit=concurrency, max_size=queue_size)
    demo.playground = play  # for hosts and tests: the catalogue and the MLX worker it uses
    # system fonts only: the page must not fetch anything from the internet
    theme = gr.themes.Soft(
        primary_hue="indigo",
        neutral_hue="slate",
        font=[gr.themes.Font(f) for f in ("system-ui", "Segoe UI", "sans-serif")],
        font_mono=[gr.themes.Font(f) for f in ("ui-monospace", "Menlo", "Consolas", "monospace")],
    )
    return demo, {"theme": theme, "css": assets.CSS}
