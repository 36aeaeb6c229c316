"""The server's metrics: Prometheus counters in a registry of their own, fed only from the
engine's events, plus the last requests' summaries for /metrics.json; the prefix cache's counts are
its own, read when /metrics is scraped."""

import collections
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine.events import CycleEvent, RunSummary
from ..engine.prefix_cache import PrefixCache

HISTORY = 50  # request summaries kept for /metrics.json


class Metrics:
    """Prometheus counters in a registry of their own, plus the last requests' summaries."""

    def __init__(self, block_size: int, prefix_cache: PrefixCache = None):
        self.registry = r = CollectorRegistry()
        if prefix_cache is not None:
            r.register(_PrefixCacheCollector(prefix_cache))
        self.drafts = Counter(
            "dflash_spec_decode_num_drafts", "DFlash cycles that drafted a block (plain steps draft none)", registry=r
        )
        self.draft_tokens = Counter(
            "dflash_spec_decode_num_draft_tokens", "Draft proposals the target verified", registry=r
        )
        self.accepted = Counter(
            "dflash_spec_decode_num_accepted_tokens", "Draft tokens accepted by the target", registry=r
        )
        self.accepted_per_pos = Counter(
            "dflash_spec_decode_num_accepted_tokens_per_pos",
            "Drafted cycles whose draft was accepted at this position (0 = first proposal)",
            ["position"],
            registry=r,
        )
        self.prompt_tokens = Counter("dflash_prompt_tokens", "Prompt tokens prefilled", ["path"], registry=r)
        self.generation_tokens = Counter("dflash_generation_tokens", "Tokens generated", ["path"], registry=r)
        self.requests = Counter(
            "dflash_requests",
            "Requests by serving path and outcome (stop, length; cancelled: the client "
            "hung up; cut_off: it read its stream too slowly; error; refused: invalid, unauthorized, queue_full)",
            ["path", "outcome"],
            registry=r,
        )
        self.running = Gauge("dflash_requests_running", "Requests generating or queued for the worker", registry=r)
        self.latency = Histogram(
            "dflash_request_latency_seconds",
            "Request time from arrival to last token",
            ["path"],
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.first_token = Histogram(
            "dflash_time_to_first_token_seconds",
            "Request time from arrival to its first committed token (queueing and prefill)",
            ["path"],
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.tokens_per_cycle = Histogram(
            "dflash_tokens_per_cycle",
            "Tokens committed per DFlash cycle (plain steps included: one each)",
            registry=r,
            buckets=tuple(range(1, block_size + 1)),
        )
        self.plain_steps = Counter(
            "dflash_policy_plain_steps",
            "Cycles where the adaptive policy drafted nothing: one plain target step over the staged token",
            registry=r,
        )
        self.verified_rows = Histogram(
            "dflash_policy_verified_rows",
            "Draft proposals the target verified per DFlash cycle, as the policy chose (plain steps at 0)",
            registry=r,
            buckets=tuple(range(block_size)),
        )
        for k in range(block_size - 1):  # every position shows, at 0 until accepted once
            self.accepted_per_pos.labels(position=str(k))
        self.recent = collections.deque(maxlen=HISTORY)
        self._lock = threading.Lock()

    def cycle(self, ev: CycleEvent):
        if ev.plain_step:
            self.plain_steps.inc()
        else:
            self.drafts.inc()
        self.verified_rows.observe(ev.verified)
        self.draft_tokens.inc(ev.verified)
        self.accepted.inc(ev.accepted_len)
        for k in range(ev.accepted_len):
            self.accepted_per_pos.labels(position=str(k)).inc()
        self.tokens_per_cycle.observe(len(ev.committed))
        self.generation_tokens.labels(path="dflash").inc(len(ev.committed))

    def finish(self, record: dict, summary: RunSummary | None, latency: float):
        path, outcome = record["path"], record["outcome"]
        self.requests.labels(path=path, outcome=outcome).inc()
        if summary is not None:
            self.prompt_tokens.labels(path=path).inc(summary.prompt_tokens)
            self.latency.labels(path=path).observe(latency)
            record.update(summary.stats(), latency_s=round(latency, 4))
        with self._lock:
            self.recent.append(record)

    def refused(self, outcome: str):
        self.requests.labels(path="none", outcome=outcome).inc()

    def mean_run_seconds(self) -> float:
        """How long the worker spent on a request lately (prefill and decoding; 1 s before any)."""
        with self._lock:
            runs = [r["prefill_s"] + r["decode_s"] for r in self.recent if "decode_s" in r]
        return sum(runs) / len(runs) if runs else 1.0

    def totals(self) -> dict:
        get = self.registry.get_sample_value
        return {
            "drafts": get("dflash_spec_decode_num_drafts_total"),
            "draft_tokens": get("dflash_spec_decode_num_draft_tokens_total"),
            "accepted_tokens": get("dflash_spec_decode_num_accepted_tokens_total"),
            "plain_steps": get("dflash_policy_plain_steps_total"),
        }

    def snapshot(self) -> dict:
        with self._lock:
            recent = list(self.recent)
        return {"totals": self.totals(), "requests": recent}


class _PrefixCacheCollector:
    """The prefix cache's own counts, read when /metrics is scraped (the worker thread keeps
    them; the playground's runs on the same pair count too)."""

    def __init__(self, cache: PrefixCache):
        self.cache = cache

    def collect(self):
        c = self.cache
        for name, doc, value in (
            ("hits", "DFlash runs whose prompt began with a cached prefix", c.hits),
            ("misses", "DFlash runs whose prompt began with no cached prefix", c.misses),
            ("reused_tokens", "Prompt tokens restored from prefix snapshots instead of prefilled", c.reused_tokens),
            ("evictions", "Prefix snapshots dropped to stay within the cache's bytes", c.evictions),
        ):
            yield CounterMetricFamily(f"dflash_prefix_cache_{name}", doc, value=value)
        yield GaugeMetricFamily("dflash_prefix_cache_bytes", "Bytes the prefix snapshots hold", value=c.nbytes)
        yield GaugeMetricFamily("dflash_prefix_cache_limit_bytes", "The prefix cache's limit", value=c.max_bytes)
        yield GaugeMetricFamily("dflash_prefix_cache_snapshots", "Prefix snapshots held", value=len(c))
