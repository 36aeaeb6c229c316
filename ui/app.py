"""The playground page: Gradio Blocks over the engine's events (ui/runner.py collects them,
ui/render/ and ui/charts.py draw them). Here the page's layout and its wiring (ui/handlers.py
handles its events, ui/view.py draws each frame). No engine logic here."""

import gradio as gr

from dflash_core.backend import default_min_confidence
from dflash_core.engine.policy import POLICIES
from dflash_core.errors import DFlashError
from dflash_core.models.registry import ASSETS as SHIPPED_DIR
from dflash_core.serving.worker import default_worker

from . import assets, render
from .handlers import DRAFT_PRECISIONS, MAX_TEMPERATURE, Playground, example_prompts
from .models import Catalogue
from .view import MAX_REJECTED_SHOWN

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
    (default: dflash_core.serving.worker.default_worker()). pair: an already loaded Pair for model/draft,
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
                copy = gr.Checkbox(
                    False,
                    label="Also copy proposals from the context (prompt lookup)",
                    info="where the last few tokens occurred before in the prompt or output, the tokens that "
                    "followed them there are proposed too; the cost model picks them or the draft's (amber: copied)",
                    elem_id="copy",
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
            policy,  # last: the API's positions from before the policy and the copy source stay
            copy,
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
            [prompt, max_tokens, block_size, chat, policy, min_confidence, temperature, top_p, seed, thinking, copy],
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
                copy,
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
