"""The playground's handlers (Playground): the model picker, a link's settings, Run, Stop,
the inspector; per-process state shared by all visitors. No engine logic here."""

import json
import tempfile
import threading
import time
import traceback
from pathlib import Path

import gradio as gr

from dflash_core.backend import default_min_confidence
from dflash_core.engine.policy import POLICIES
from dflash_core.engine.sampling import Sampling
from dflash_core.errors import DFlashError
from dflash_core.models.memory import device_memory, gb

from . import render
from .models import Catalogue
from .runner import Comparison, compare
from .view import MAX_REJECTED_SHOWN, RunView, Shown

PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "examples.json"
# While an engine is being timed the page does not change: the handler runs in the same process
# as the engine, and the browser on the same cores, so any page update is time taken from the run
# it measures (measured on two cores, even two light updates a second slowed DFlash's draft phase
# by ~10%: docs/benchmarks.md). Each engine's text appears when it has finished; the race replay
# then plays both back on one clock from their timestamps.
SETTLE_S = 0.5  # after a stage change, before the next engine starts: the browser draws in between
MAX_TEMPERATURE = 1.5
KEEP_EXPORTS = 200  # run files kept for download on a long-running host
# the draft's precision choices: its linear layers quantized at load (nn.quantize), or as stored
FULL_PRECISION = "as stored"
DRAFT_PRECISIONS = {FULL_PRECISION: None, "8-bit": 8, "4-bit": 4}


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
        &min_confidence=...&temperature=...&top_p=...&seed=...&thinking=...&copy=... A link without a policy
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

        def switch(name, default=False) -> bool:
            return q[name] in ("1", "true", "yes") if name in q else default

        policy = policy_of_query(q)
        return (
            q.get("prompt", example_prompts()[0]),
            number("max_tokens", min(128, cap), 1, cap),
            number("block_size", B, 2, B),
            switch("chat", self.catalogue.is_chat(key)),
            policy,
            gr.Slider(
                value=number("min_confidence", default_min_confidence(), 0.0, 1.0, float),
                interactive=policy == "fixed",
            ),
            number("temperature", 0.0, 0.0, MAX_TEMPERATURE, float),
            number("top_p", 1.0, 0.05, 1.0, float),
            number("seed", 0, 0, 2**31 - 1),
            info,
            gr.Checkbox(value=switch("thinking"), visible=self.thinking_switch(key)),
            switch("copy"),
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
        copy=False,
        request: gr.Request = None,
    ):
        """Baseline, then DFlash, then the lossless check, streamed to the page. Temperature 0 is
        greedy; above it, plain sampling against speculative sampling with the same seed. Thinking
        turns on the chat template's thinking mode where it has one; draft_quant is the draft's
        precision (DRAFT_PRECISIONS); policy is DFlash's verification policy (POLICIES), and
        min_confidence applies to the fixed one alone; copy also proposes tokens copied from the
        context. policy and copy come last, so that callers of the API from before them keep their
        positions (and get the adaptive policy, without copies)."""
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
            copy=bool(copy),
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
