//! What the engine loop measures, kept in atomics (the loop writes, any thread reads; nothing
//! locks) and rendered in Prometheus' text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::FinishReason;

/// Bucket bounds (seconds) of the time to first token.
const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0,
];
/// Bucket bounds (seconds) of the time between two tokens of a choice.
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 10.0, 20.0, 40.0, 80.0,
];
/// Bucket bounds (seconds) of whole requests and of their time in the queue.
const REQUEST_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
];
/// Bucket bounds (rows) of the batch of one step.
const BATCH_BOUNDS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

/// Adds `v` to an f64 kept as bits.
fn add_f64(cell: &AtomicU64, v: f64) {
    let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        Some((f64::from_bits(bits) + v).to_bits())
    });
}

/// A Prometheus histogram: a count per bucket (not cumulative here; cumulated when rendered), the
/// count and the sum of the observations.
pub(crate) struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub(crate) fn observe(&self, v: f64) {
        let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        add_f64(&self.sum, v);
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub(crate) fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Ordering::Relaxed))
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        self.render_labelled(out, name, help, "");
    }

    /// With `labels` (`key="value",...`, already escaped) on every series.
    fn render_labelled(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (b, n) in self.bounds.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        // Read after the buckets: +Inf is never below the last bucket even while observed.
        let count = self.count().max(cumulative);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braced = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braced} {}", self.sum());
        let _ = writeln!(out, "{name}_count{braced} {count}");
    }
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// Why `submit` turned a request away.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rejection {
    QueueFull,
    Invalid,
    PromptTooLong,
    ShuttingDown,
}

/// Everything the loop (and `submit`) counts.
pub(crate) struct Metrics {
    pub(crate) time_to_first_token: Histogram,
    pub(crate) inter_token_latency: Histogram,
    pub(crate) e2e_latency: Histogram,
    pub(crate) queue_time: Histogram,
    pub(crate) batch_rows: Histogram,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) generation_tokens: AtomicU64,
    /// Generated tokens a structured-output constraint forced (appended without sampling).
    pub(crate) forced_tokens: AtomicU64,
    /// Rows of logits the output head computed in two passes and in one, the vocabulary rows
    /// the two-pass head's second pass computed, and the head's bytes read.
    pub(crate) head_two_pass_rows: AtomicU64,
    pub(crate) head_one_pass_rows: AtomicU64,
    pub(crate) head_refined_tokens: AtomicU64,
    pub(crate) head_bytes: AtomicU64,
    /// Prompt tokens actually computed (prefills and recomputation after preemption).
    pub(crate) computed_prompt_tokens: AtomicU64,
    /// Finished choices by reason: stop, length, cancelled.
    pub(crate) finished: [AtomicU64; 3],
    pub(crate) errors: AtomicU64,
    pub(crate) rejected: [AtomicU64; 4],
    pub(crate) requests_submitted: AtomicU64,
    pub(crate) running: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) running_sequences: AtomicU64,
    pub(crate) kv_blocks_used: AtomicU64,
    pub(crate) kv_blocks_total: AtomicU64,
    pub(crate) kv_blocks_cached_free: AtomicU64,
    pub(crate) kv_window_blocks_total: AtomicU64,
    pub(crate) kv_window_blocks_used: AtomicU64,
    pub(crate) kv_evictions: AtomicU64,
    /// KV-event batches dropped because their reader fell behind.
    pub(crate) kv_events_dropped: AtomicU64,
    pub(crate) prefix_query_tokens: AtomicU64,
    pub(crate) prefix_hit_tokens: AtomicU64,
    pub(crate) preemptions: AtomicU64,
    pub(crate) steps: AtomicU64,
    pub(crate) spec_draft_tokens: AtomicU64,
    pub(crate) spec_accepted_tokens: AtomicU64,
    /// Jobs run on the loop between steps (lenses, counterfactuals).
    pub(crate) jobs: AtomicU64,
    /// Speculative generations finished in the loop (a pass or a round per iteration).
    pub(crate) speculations: AtomicU64,
    pub(crate) job_seconds: Histogram,
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let z = || AtomicU64::new(0);
        Metrics {
            time_to_first_token: Histogram::new(TTFT_BOUNDS),
            inter_token_latency: Histogram::new(ITL_BOUNDS),
            e2e_latency: Histogram::new(REQUEST_BOUNDS),
            queue_time: Histogram::new(REQUEST_BOUNDS),
            batch_rows: Histogram::new(BATCH_BOUNDS),
            prompt_tokens: z(),
            generation_tokens: z(),
            forced_tokens: z(),
            head_two_pass_rows: z(),
            head_one_pass_rows: z(),
            head_refined_tokens: z(),
            head_bytes: z(),
            computed_prompt_tokens: z(),
            finished: [z(), z(), z()],
            errors: z(),
            rejected: [z(), z(), z(), z()],
            requests_submitted: z(),
            running: z(),
            waiting: z(),
            running_sequences: z(),
            kv_blocks_used: z(),
            kv_blocks_total: z(),
            kv_window_blocks_total: z(),
            kv_window_blocks_used: z(),
            kv_blocks_cached_free: z(),
            kv_evictions: z(),
            kv_events_dropped: z(),
            prefix_query_tokens: z(),
            prefix_hit_tokens: z(),
            preemptions: z(),
            steps: z(),
            spec_draft_tokens: z(),
            spec_accepted_tokens: z(),
            jobs: z(),
            speculations: z(),
            job_seconds: Histogram::new(REQUEST_BOUNDS),
        }
    }

    pub(crate) fn add(cell: &AtomicU64, n: u64) {
        cell.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set(cell: &AtomicU64, v: u64) {
        cell.store(v, Ordering::Relaxed);
    }

    pub(crate) fn finish(&self, reason: FinishReason) {
        let i = match reason {
            FinishReason::Stop => 0,
            FinishReason::Length => 1,
            FinishReason::Cancelled => 2,
        };
        Self::add(&self.finished[i], 1);
    }

    pub(crate) fn reject(&self, why: Rejection) {
        Self::add(&self.rejected[why as usize], 1);
    }

    /// Prompt tokens served from the prefix cache over prompt tokens looked up (0 before any).
    pub(crate) fn prefix_hit_ratio(&self) -> f64 {
        let q = load(&self.prefix_query_tokens);
        if q == 0 {
            0.0
        } else {
            load(&self.prefix_hit_tokens) as f64 / q as f64
        }
    }

    /// Seconds a client should wait before trying again when the queue is full: the mean time
    /// requests have spent queued, at least 1 and at most 60.
    pub(crate) fn retry_after_s(&self) -> u64 {
        let n = self.queue_time.count();
        let mean = if n == 0 {
            1.0
        } else {
            self.queue_time.sum() / n as f64
        };
        (mean.ceil() as u64).clamp(1, 60)
    }

    /// Everything in Prometheus' text exposition format, names prefixed `rill_`.
    pub(crate) fn render(&self, cache: &CacheInfo) -> String {
        let mut o = String::with_capacity(8192);
        let _ = writeln!(
            o,
            "# HELP rill_cache_config_info The KV cache's configuration (the value is always 1).\n\
             # TYPE rill_cache_config_info gauge\n\
             rill_cache_config_info{{block_size=\"{}\",num_blocks=\"{}\",cache_dtype=\"{}\",\
             enable_prefix_caching=\"{}\"}} 1",
            cache.block_size, cache.blocks_total, cache.dtype, cache.prefix_caching
        );
        self.time_to_first_token.render(
            &mut o,
            "rill_time_to_first_token_seconds",
            "Time from submission to the first generated token of a request.",
        );
        self.inter_token_latency.render(
            &mut o,
            "rill_inter_token_latency_seconds",
            "Time between two consecutive tokens of a choice.",
        );
        self.e2e_latency.render(
            &mut o,
            "rill_e2e_request_latency_seconds",
            "Time from submission to the end of a request's last choice.",
        );
        self.queue_time.render(
            &mut o,
            "rill_request_queue_time_seconds",
            "Time from submission to the first scheduling of a request.",
        );
        self.batch_rows.render(
            &mut o,
            "rill_batch_rows",
            "Rows (prefill and decode tokens) in the batch of one engine step.",
        );
        counter(
            &mut o,
            "rill_prompt_tokens_total",
            "Prompt tokens of admitted requests.",
            load(&self.prompt_tokens),
        );
        counter(
            &mut o,
            "rill_generation_tokens_total",
            "Generated tokens.",
            load(&self.generation_tokens),
        );
        counter(
            &mut o,
            "rill_forced_tokens_total",
            "Generated tokens forced by a structured-output constraint (appended without sampling, computed in one pass).",
            load(&self.forced_tokens),
        );
        counter(
            &mut o,
            "rill_head_two_pass_rows_total",
            "Rows of logits the output head computed in two passes (a 4-bit copy, then the rows a bound could not rule out).",
            load(&self.head_two_pass_rows),
        );
        counter(
            &mut o,
            "rill_head_one_pass_rows_total",
            "Rows of logits the output head computed in one pass (every logit).",
            load(&self.head_one_pass_rows),
        );
        counter(
            &mut o,
            "rill_head_refined_tokens_total",
            "Vocabulary rows the two-pass head's second pass computed, summed over its rows of logits.",
            load(&self.head_refined_tokens),
        );
        counter(
            &mut o,
            "rill_head_bytes_total",
            "Bytes of output head read.",
            load(&self.head_bytes),
        );
        counter(
            &mut o,
            "rill_computed_prompt_tokens_total",
            "Prompt positions computed by prefill (prefix-cache hits excluded, recomputation after preemption included).",
            load(&self.computed_prompt_tokens),
        );
        counter(
            &mut o,
            "rill_requests_submitted_total",
            "Requests accepted into the queue.",
            load(&self.requests_submitted),
        );
        let _ = writeln!(
            o,
            "# HELP rill_requests_finished_total Finished choices (one per choice of a request) by finish reason.\n# TYPE rill_requests_finished_total counter"
        );
        for (i, reason) in ["stop", "length", "cancelled"].iter().enumerate() {
            let _ = writeln!(
                o,
                "rill_requests_finished_total{{finish_reason=\"{reason}\"}} {}",
                load(&self.finished[i])
            );
        }
        counter(
            &mut o,
            "rill_request_errors_total",
            "Requests ended by an engine error.",
            load(&self.errors),
        );
        let _ = writeln!(
            o,
            "# HELP rill_requests_rejected_total Requests refused by submit, by reason.\n# TYPE rill_requests_rejected_total counter"
        );
        for (i, reason) in ["queue_full", "invalid", "prompt_too_long", "shutting_down"]
            .iter()
            .enumerate()
        {
            let _ = writeln!(
                o,
                "rill_requests_rejected_total{{reason=\"{reason}\"}} {}",
                load(&self.rejected[i])
            );
        }
        gauge(
            &mut o,
            "rill_requests_running",
            "Requests with at least one sequence in the running batch.",
            load(&self.running) as f64,
        );
        gauge(
            &mut o,
            "rill_requests_waiting",
            "Requests waiting to be scheduled (queued, or preempted).",
            load(&self.waiting) as f64,
        );
        gauge(
            &mut o,
            "rill_sequences_running",
            "Sequences (choices) in the running batch.",
            load(&self.running_sequences) as f64,
        );
        let total = load(&self.kv_blocks_total);
        let used = load(&self.kv_blocks_used);
        gauge(
            &mut o,
            "rill_kv_blocks_total",
            "Blocks of the KV-cache arena.",
            total as f64,
        );
        gauge(
            &mut o,
            "rill_kv_blocks_used",
            "KV blocks referenced by sequences.",
            used as f64,
        );
        gauge(
            &mut o,
            "rill_kv_blocks_cached_free",
            "KV blocks kept only for the prefix cache (free for reuse).",
            load(&self.kv_blocks_cached_free) as f64,
        );
        gauge(
            &mut o,
            "rill_kv_window_blocks_total",
            "Blocks of the sliding-window layers' KV arena (0 without a window).",
            load(&self.kv_window_blocks_total) as f64,
        );
        gauge(
            &mut o,
            "rill_kv_window_blocks_used",
            "Sliding-window KV blocks referenced by sequences.",
            load(&self.kv_window_blocks_used) as f64,
        );
        gauge(
            &mut o,
            "rill_kv_cache_usage_ratio",
            "Used KV blocks over all KV blocks.",
            if total == 0 {
                0.0
            } else {
                used as f64 / total as f64
            },
        );
        counter(
            &mut o,
            "rill_kv_evictions_total",
            "Cached KV blocks evicted to make room.",
            load(&self.kv_evictions),
        );
        counter(
            &mut o,
            "rill_kv_events_dropped_total",
            "KV-event batches dropped because their publisher fell behind (0 without --kv-events).",
            load(&self.kv_events_dropped),
        );
        counter(
            &mut o,
            "rill_prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            load(&self.prefix_query_tokens),
        );
        counter(
            &mut o,
            "rill_prefix_cache_hits_total",
            "Prompt tokens served from the prefix cache.",
            load(&self.prefix_hit_tokens),
        );
        gauge(
            &mut o,
            "rill_prefix_cache_hit_ratio",
            "Prefix-cache hit tokens over prompt tokens looked up.",
            self.prefix_hit_ratio(),
        );
        counter(
            &mut o,
            "rill_preemptions_total",
            "Sequences preempted (KV blocks freed, recomputed later) for lack of KV blocks.",
            load(&self.preemptions),
        );
        counter(
            &mut o,
            "rill_engine_steps_total",
            "Forward passes run by the engine loop.",
            load(&self.steps),
        );
        counter(
            &mut o,
            "rill_jobs_total",
            "Engine jobs run between steps (lenses and counterfactuals of the glass-box API).",
            load(&self.jobs),
        );
        counter(
            &mut o,
            "rill_speculative_generations_total",
            "Speculative generations of the glass-box API finished, each stepped a pass or a round per loop iteration beside the other requests.",
            load(&self.speculations),
        );
        self.job_seconds.render(
            &mut o,
            "rill_job_seconds",
            "Time the engine loop spent in one exclusive job (other requests paused meanwhile).",
        );
        let drafted = load(&self.spec_draft_tokens);
        let accepted = load(&self.spec_accepted_tokens);
        counter(
            &mut o,
            "rill_spec_decode_draft_tokens_total",
            "Speculative tokens drafted (prompt lookup, on by default; 0 with --prompt-lookup 0).",
            drafted,
        );
        counter(
            &mut o,
            "rill_spec_decode_accepted_tokens_total",
            "Speculative tokens accepted.",
            accepted,
        );
        gauge(
            &mut o,
            "rill_spec_decode_acceptance_ratio",
            "Accepted over drafted speculative tokens (0 when none were drafted).",
            if drafted == 0 {
                0.0
            } else {
                accepted as f64 / drafted as f64
            },
        );
        o
    }
}

/// What the cache-config info metrics label.
pub(crate) struct CacheInfo<'a> {
    pub(crate) block_size: usize,
    pub(crate) blocks_total: usize,
    pub(crate) dtype: String,
    pub(crate) prefix_caching: bool,
    pub(crate) model_name: &'a str,
}

/// Escapes a Prometheus label value.
fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// The same measurements under vLLM's names (`vllm:*`, labelled with `model_name`), as the
    /// routers (the Gateway API Inference Extension's endpoint picker, llm-d, vLLM's production
    /// stack, AIBrix), KEDA examples and dashboards read them. Semantics follow vLLM's: the KV
    /// usage is a 0-1 fraction, the prefix-cache counters count tokens, `abort` is a cancelled
    /// request.
    pub(crate) fn render_vllm(&self, cache: &CacheInfo) -> String {
        let mut o = String::with_capacity(8192);
        // vLLM labels every series with the served name and its engine (data-parallel) index.
        let model = format!(
            "model_name=\"{}\",engine=\"0\"",
            escape_label(cache.model_name)
        );
        let labelled = |o: &mut String, kind: &str, name: &str, help: &str, v: f64| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{model}}} {v}"
            );
        };
        labelled(
            &mut o,
            "gauge",
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            load(&self.running) as f64,
        );
        labelled(
            &mut o,
            "gauge",
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            load(&self.waiting) as f64,
        );
        let total = load(&self.kv_blocks_total);
        let usage = if total == 0 {
            0.0
        } else {
            load(&self.kv_blocks_used) as f64 / total as f64
        };
        labelled(
            &mut o,
            "gauge",
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            usage,
        );
        labelled(
            &mut o,
            "gauge",
            "vllm:gpu_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage (the older name).",
            usage,
        );
        let _ = writeln!(
            o,
            "# HELP vllm:cache_config_info Information of the KV cache's configuration.\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\",\
             num_cpu_blocks=\"0\",cache_dtype=\"{}\",enable_prefix_caching=\"{}\",engine=\"0\"}} 1",
            cache.block_size,
            cache.blocks_total,
            cache.dtype,
            if cache.prefix_caching {
                "True"
            } else {
                "False"
            },
        );
        for (name, help, v) in [
            (
                "vllm:prefix_cache_queries",
                "Prefix-cache queries, in terms of number of queried tokens.",
                load(&self.prefix_query_tokens),
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix-cache hits, in terms of number of cached tokens.",
                load(&self.prefix_hit_tokens),
            ),
            (
                "vllm:num_preemptions",
                "Cumulative number of preemptions.",
                load(&self.preemptions),
            ),
            (
                "vllm:prompt_tokens",
                "Number of prefill tokens processed.",
                load(&self.prompt_tokens),
            ),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                load(&self.generation_tokens),
            ),
        ] {
            let _ = writeln!(
                o,
                "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{model}}} {v}"
            );
        }
        let _ = writeln!(
            o,
            "# HELP vllm:request_success_total Count of successfully processed requests.\n\
             # TYPE vllm:request_success_total counter"
        );
        for (i, reason) in ["stop", "length", "abort"].iter().enumerate() {
            let _ = writeln!(
                o,
                "vllm:request_success_total{{{model},finished_reason=\"{reason}\"}} {}",
                load(&self.finished[i])
            );
        }
        self.time_to_first_token.render_labelled(
            &mut o,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &model,
        );
        self.inter_token_latency.render_labelled(
            &mut o,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &model,
        );
        self.inter_token_latency.render_labelled(
            &mut o,
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds (the inter-token latency).",
            &model,
        );
        self.e2e_latency.render_labelled(
            &mut o,
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            &model,
        );
        self.queue_time.render_labelled(
            &mut o,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in the waiting queue in seconds.",
            &model,
        );
        o
    }
}
