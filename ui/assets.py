"""The page's CSS and the small client-side scripts (race replay, copy link, theme switch).
Colors are translucent so the same rules read well on the light and the dark theme."""

CSS = """
.gradio-container { max-width: 1320px !important; }
#title h1 { margin: 0; font-size: 1.6rem; letter-spacing: -0.01em; }
#title p { margin: 2px 0 0; opacity: 0.75; }
#theme-toggle { align-self: flex-start; margin-left: auto; }
.pane-title { font-weight: 600; font-size: 0.95rem; margin: 0 0 4px; display: flex; gap: 8px; align-items: center; }
.pane-title .dot { width: 10px; height: 10px; border-radius: 50%; display: inline-block; }
.out {
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; line-height: 1.55;
  white-space: pre-wrap; word-break: break-word; min-height: 260px; max-height: 460px; overflow-y: auto;
  padding: 10px 12px; border-radius: 8px; border: 1px solid var(--border-color-primary);
  background: var(--background-fill-secondary);
}
.out.empty { opacity: 0.55; font-family: inherit; }
.ws { opacity: 0.4; }
.tok { border-radius: 3px; padding: 0 1px; }
.tok-target { background: rgba(99, 102, 241, 0.28); box-shadow: inset 0 -2px 0 rgba(99, 102, 241, 0.85); }
.tok-accepted { background: rgba(16, 185, 129, 0.24); }
.tok-rejected { background: rgba(244, 63, 94, 0.16); color: rgba(225, 29, 72, 0.95); text-decoration: line-through;
  text-decoration-color: rgba(225, 29, 72, 0.8); font-size: 0.86em; opacity: 0.85; }
.dark .tok-rejected { color: rgba(251, 113, 133, 0.95); }
.tok-unverified { color: rgba(128, 128, 128, 0.9); text-decoration: line-through dotted; font-size: 0.86em;
  opacity: 0.7; }
/* proposals copied from the context (the copy source) rather than drafted */
.tok-copied { box-shadow: inset 0 -2px 0 rgba(217, 119, 6, 0.9); }
.tok-accepted.tok-copied { background: rgba(245, 158, 11, 0.28); }
.tok-blank { outline: 1px dotted rgba(128, 128, 128, 0.45); }
.tok-more { font-size: 0.75em; opacity: 0.6; padding: 0 3px; }
.cycle { border-right: 1px solid rgba(128, 128, 128, 0.35); padding-right: 1px; margin-right: 1px; }
.cycle-bonus .tok-accepted { background: rgba(16, 185, 129, 0.38); }
/* a plain step of the adaptive policy: no draft, the target decoded one token by itself */
.cycle.plain-step { outline: 1px dashed rgba(128, 128, 128, 0.6); outline-offset: -1px; border-radius: 3px; }
.tok-target.tok-plain { background: rgba(128, 128, 128, 0.16); box-shadow: inset 0 -2px 0 rgba(128, 128, 128, 0.55); }
.legend .cycle.plain-step { border-right: none; margin-left: 8px; }
.legend .cycle.plain-step .tok { margin: 0; }
.inspector .decision { margin-top: 4px; }
.inspector.plain-step table { width: auto; }
.inspector.plain-step td { min-width: 80px; }
.legend { font-size: 12px; opacity: 0.85; margin-top: 6px; line-height: 2; }
.legend .muted { opacity: 0.75; }
.legend .tok { margin: 0 3px 0 8px; padding: 1px 4px; }
.stats { display: flex; gap: 8px; align-items: stretch; flex-wrap: wrap; margin-bottom: 6px; }
.stat { flex: 1 1 70px; padding: 6px 10px; border-radius: 8px; border: 1px solid var(--border-color-primary);
  background: var(--background-fill-primary); }
.stat .v { font-size: 1.15rem; font-weight: 650; font-variant-numeric: tabular-nums; }
.stat .k, .speedup .k { font-size: 11px; opacity: 0.65; text-transform: uppercase; letter-spacing: 0.04em; }
.status { align-self: center; font-size: 12px; padding: 2px 8px; border-radius: 99px;
  background: rgba(128, 128, 128, 0.15); }
.verdicts { display: flex; gap: 10px; align-items: stretch; }
.speedup, .lossless { padding: 10px 14px; border-radius: 10px; border: 1px solid var(--border-color-primary);
  background: var(--background-fill-primary); height: 100%; box-sizing: border-box; }
.speedup .v { font-size: 1.8rem; font-weight: 700; font-variant-numeric: tabular-nums; }
.speedup.up .v { color: #059669; } .dark .speedup.up .v { color: #34d399; }
.speedup.down .v { color: #d97706; }
.speedup .sub, .lossless .sub { font-size: 12px; opacity: 0.75; }
.lossless { display: flex; gap: 12px; align-items: center; }
.lossless .icon { font-size: 1.6rem; font-weight: 700; width: 40px; height: 40px; border-radius: 50%;
  display: flex; align-items: center; justify-content: center; background: rgba(128, 128, 128, 0.15); flex: none; }
.lossless.identical .icon { background: rgba(16, 185, 129, 0.22); color: #059669; }
.lossless.diverged .icon { background: rgba(244, 63, 94, 0.2); color: #e11d48; }
.lossless .v { font-weight: 650; }
.error-panel { padding: 10px 14px; border-radius: 8px; border: 1px solid rgba(244, 63, 94, 0.5);
  background: rgba(244, 63, 94, 0.1); }
.error-panel b { display: block; margin-bottom: 2px; }
.info-panel { padding: 8px 12px; border-radius: 8px; background: rgba(99, 102, 241, 0.1); font-size: 13px; }
.warning-panel { margin-top: 6px; padding: 8px 12px; border-radius: 8px; border: 1px solid rgba(245, 158, 11, 0.55);
  background: rgba(245, 158, 11, 0.12); font-size: 13px; }
.race { padding: 4px 0; }
.race-head { font-size: 13px; opacity: 0.8; margin-bottom: 6px; }
.race-head .clock { font-weight: 700; font-variant-numeric: tabular-nums; }
.lane { margin-bottom: 10px; }
.lane-head { display: flex; justify-content: space-between; font-size: 13px; }
.bar { height: 6px; border-radius: 3px; background: rgba(128, 128, 128, 0.18); margin: 4px 0; overflow: hidden; }
.bar .fill { height: 100%; width: 0; background: #8b93a7; }
.bar .fill[data-lane="dflash"] { background: #6366f1; }
.lane-text { font-size: 12px; line-height: 1.45; max-height: 120px; overflow-y: auto; white-space: pre-wrap;
  word-break: break-word; margin: 0; padding: 6px 8px; border-radius: 6px; background: var(--background-fill-secondary); }
.inspector .insp-title { font-weight: 650; margin-bottom: 6px; }
.inspector .table-wrap { overflow-x: auto; }
.inspector table { border-collapse: collapse; font-size: 12px; width: 100%; }
.inspector th, .inspector td { border: 1px solid var(--border-color-primary); padding: 3px 5px; text-align: center; }
.inspector th.rowh { text-align: left; white-space: nowrap; font-weight: 600; }
.inspector td code { white-space: pre; font-size: 12px; background: none; padding: 0; }
.inspector .ws, .explain .ws { opacity: 0.75; }
.inspector td.staged { background: rgba(99, 102, 241, 0.22); }
.inspector td.mask { opacity: 0.5; }
.inspector td.unverified { opacity: 0.45; }
.inspector td.acc { background: rgba(16, 185, 129, 0.2); }
.inspector td.rej { background: rgba(244, 63, 94, 0.14); text-decoration: line-through; }
.inspector td.fix { background: rgba(99, 102, 241, 0.22); font-weight: 700; }
.inspector td.yes { color: #059669; } .inspector td.no { color: #e11d48; }
.inspector .facts { margin-top: 10px; display: grid; gap: 4px; font-size: 13px; }
.inspector .facts .k { display: inline-block; min-width: 150px; opacity: 0.65; }
.inspector .muted { opacity: 0.6; }
.explain { font-size: 13px; line-height: 1.5; padding: 8px 12px; border-left: 3px solid #6366f1;
  background: rgba(99, 102, 241, 0.06); border-radius: 0 8px 8px 0; margin-top: 10px; }
.explain p { margin: 0 0 6px; }
#run { min-height: 44px; }
"""

# Replays the race from the timeline stored (escaped JSON) in .race[data-timeline]: both engines
# on one clock, each token appearing at its recorded time, slowed or sped up by `speed`.
RACE_JS = """
() => {
  const root = document.querySelector('#race .race');
  if (!root) return;
  if (window.__dflashRace) cancelAnimationFrame(window.__dflashRace);
  const data = JSON.parse(root.dataset.timeline);
  const end = Math.max(data.baseline.t.at(-1) || 0, data.dflash.t.at(-1) || 0);
  const lanes = ['baseline', 'dflash'].map(k => ({
    k, d: data[k], shown: 0,
    text: root.querySelector(`.lane-text[data-lane="${k}"]`),
    fill: root.querySelector(`.fill[data-lane="${k}"]`),
    count: root.querySelector(`.lane-count[data-lane="${k}"]`),
  }));
  lanes.forEach(l => { l.text.textContent = ''; });
  root.removeAttribute('data-played');
  const clock = root.querySelector('.clock');
  const t0 = performance.now();
  const step = (now) => {
    const t = (now - t0) / 1000 * data.speed;
    clock.textContent = Math.min(t, end).toFixed(2) + ' s';
    for (const l of lanes) {
      let n = l.shown;
      while (n < l.d.t.length && l.d.t[n] <= t) n++;
      if (n !== l.shown) {
        l.text.textContent += l.d.pieces.slice(l.shown, n).join('');
        l.text.scrollTop = l.text.scrollHeight;
        l.shown = n;
      }
      const total = l.d.t.length || 1;
      l.fill.style.width = (100 * n / total) + '%';
      const done = n >= l.d.t.length ? ' · finished at ' + (l.d.t.at(-1) || 0).toFixed(2) + ' s' : '';
      l.count.textContent = n + ' tokens' + done;
    }
    if (t <= end) window.__dflashRace = requestAnimationFrame(step);
    else root.dataset.played = '1';  // the replay has ended (scripts wait for it)
  };
  window.__dflashRace = requestAnimationFrame(step);
}
"""

# Builds a permalink for the current settings, copies it when the browser allows, and shows it.
COPY_LINK_JS = """
(prompt, maxTokens, blockSize, chat, policy, minConfidence, temperature, topP, seed, thinking, copy) => {
  const u = new URL(window.location.href);
  u.search = '';
  u.searchParams.set('prompt', prompt);
  u.searchParams.set('max_tokens', maxTokens);
  u.searchParams.set('block_size', blockSize);
  u.searchParams.set('chat', chat ? '1' : '0');
  u.searchParams.set('policy', policy);
  if (policy === 'fixed') u.searchParams.set('min_confidence', minConfidence);  // the fixed policy's alone
  if (thinking) u.searchParams.set('thinking', '1');
  if (copy) u.searchParams.set('copy', '1');
  if (temperature > 0) {
    u.searchParams.set('temperature', temperature);
    u.searchParams.set('top_p', topP);
    u.searchParams.set('seed', seed);
  }
  const link = u.toString();
  if (navigator.clipboard) navigator.clipboard.writeText(link).catch(() => {});
  return link;
}
"""

THEME_JS = """
() => { document.body.classList.toggle('dark'); document.querySelector('gradio-app')?.classList.toggle('dark'); }
"""
