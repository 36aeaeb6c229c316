"""What each frame of a run shows: RunView turns a Comparison into component updates (the
panes' HTML from ui/render, the figures from ui/charts); Shown is what a session keeps of its last run."""

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gradio as gr

from dflash_core.benchmark import recorded_figure

from . import charts, render
from .runner import Comparison

MAX_REJECTED_SHOWN = 4  # rejected drafts shown per cycle in the colored pane (the rest as "+N")


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
