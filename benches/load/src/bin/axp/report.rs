//! What a run found: a human summary and one JSON line (for `benches/axp.sh`).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::Args;

/// Latency quantiles in milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Quantiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Quantiles {
    pub fn of(h: &Histogram<u64>) -> Option<Quantiles> {
        (!h.is_empty()).then(|| Quantiles {
            count: h.len(),
            p50_ms: h.value_at_quantile(0.50) as f64 / 1e6,
            p99_ms: h.value_at_quantile(0.99) as f64 / 1e6,
            p999_ms: h.value_at_quantile(0.999) as f64 / 1e6,
            max_ms: h.max() as f64 / 1e6,
        })
    }
}

pub struct Report {
    pub exec_conns: usize,
    pub viewer_conns: usize,
    pub connect_s: f64,
    pub sessions_s: f64,
    pub claims_s: f64,
    pub turns_s: f64,
    pub window_s: f64,
    /// Emits sent inside the window and answered with a result.
    pub window_emits: u64,
    pub emits_total: u64,
    pub emit_reply: Option<Quantiles>,
    /// Emit send → a viewer's read of the echoed action, one sample per emit per viewer.
    pub deliver: Option<Quantiles>,
    pub renew: Option<Quantiles>,
    /// Settle sent → the next turn reserved.
    pub cycle: Option<Quantiles>,
    /// How late the tool sent emits against its schedule.
    pub lag: Option<Quantiles>,
    pub deliveries_expected: u64,
    pub deliveries_received: u64,
    /// Requests still unanswered when the drain ended.
    pub unanswered: usize,
    pub settles: u64,
    pub turns_started: u64,
    pub renewals: u64,
    pub max_renew_gap_ms: f64,
    pub lease_changed_null: u64,
    pub stale_answers: u64,
    pub dead_executors: usize,
    pub errors: BTreeMap<i64, u64>,
    pub error_samples: Vec<String>,
    pub rss_before_kib: Option<u64>,
    pub rss_setup_kib: Option<u64>,
    pub rss_after_kib: Option<u64>,
    pub host_cpu_pct: Option<f64>,
    pub tool_cpu_pct: Option<f64>,
    pub steal_ms: Option<f64>,
    /// What ended the run early, if anything.
    pub fatal: Option<String>,
}

fn q_human(q: Option<&Quantiles>) -> String {
    match q {
        Some(q) => format!(
            "p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms ({} samples)",
            q.p50_ms, q.p99_ms, q.p999_ms, q.max_ms, q.count
        ),
        None => "no samples".into(),
    }
}

fn q_json(prefix: &str, q: Option<&Quantiles>) -> String {
    let f = |v: Option<f64>| v.map_or("null".to_owned(), |v| format!("{v:.3}"));
    format!(
        "\"{prefix}_count\":{},\"{prefix}_p50_ms\":{},\"{prefix}_p99_ms\":{},\"{prefix}_p999_ms\":{},\"{prefix}_max_ms\":{}",
        q.map_or(0, |q| q.count),
        f(q.map(|q| q.p50_ms)),
        f(q.map(|q| q.p99_ms)),
        f(q.map(|q| q.p999_ms)),
        f(q.map(|q| q.max_ms)),
    )
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("null".to_owned(), |v| v.to_string())
}

fn opt_f(v: Option<f64>) -> String {
    v.map_or("null".to_owned(), |v| format!("{v:.1}"))
}

fn mib(k: Option<u64>) -> String {
    k.map_or("-".to_owned(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

impl Report {
    pub fn emits_per_s(&self) -> f64 {
        self.window_emits as f64 / self.window_s
    }

    pub fn leases_lost(&self) -> u64 {
        self.lease_changed_null + self.stale_answers
    }

    pub fn error_answers(&self) -> u64 {
        self.errors.values().sum()
    }

    pub fn missing_deliveries(&self) -> u64 {
        self.deliveries_expected
            .saturating_sub(self.deliveries_received)
    }

    pub fn extra_deliveries(&self) -> u64 {
        self.deliveries_received
            .saturating_sub(self.deliveries_expected)
    }

    /// What broke, if anything: a lost lease, an error answer, a lost or duplicated delivery,
    /// an answer that never came.
    pub fn broken(&self) -> String {
        let mut b = Vec::new();
        if let Some(f) = &self.fatal {
            b.push(format!("the run ended early: {f}"));
        }
        if self.leases_lost() > 0 {
            b.push(format!(
                "{} lease(s) lost ({} leaseChanged with lease null, {} -32040 answers)",
                self.leases_lost(),
                self.lease_changed_null,
                self.stale_answers
            ));
        }
        if self.error_answers() > 0 {
            b.push(format!(
                "{} error answer(s) {:?}",
                self.error_answers(),
                self.errors
            ));
        }
        if self.missing_deliveries() > 0 && self.fatal.is_none() {
            b.push(format!(
                "{} of {} deliveries to viewers missing",
                self.missing_deliveries(),
                self.deliveries_expected
            ));
        }
        if self.extra_deliveries() > 0 {
            b.push(format!(
                "{} deliveries more than emitted",
                self.extra_deliveries()
            ));
        }
        if self.unanswered > 0 && self.fatal.is_none() {
            b.push(format!(
                "{} request(s) unanswered after the drain",
                self.unanswered
            ));
        }
        b.join("; ")
    }

    pub fn invariants_hold(&self) -> bool {
        self.broken().is_empty()
    }

    /// Sustained: invariants hold, at least 95% of the offered emits answered in the window,
    /// and the p99 emit→subscriber latency within the target (when there are viewers).
    pub fn sustained(&self, args: &Args) -> bool {
        let offered = f64::from(args.sessions) * args.rate;
        let target_ms = args.p99_target.as_secs_f64() * 1000.0;
        self.invariants_hold()
            && self.emits_per_s() >= 0.95 * offered
            && (args.viewers == 0 || self.deliver.is_some_and(|q| q.p99_ms <= target_ms))
    }

    pub fn human(&self, args: &Args) -> String {
        let offered = f64::from(args.sessions) * args.rate;
        let mut s = format!(
            "axhost-axp: N={} R={} V={} batch={} K={} cycle={:?} lease={} ms, {:.0} s window after {:.0} s warmup\n",
            args.sessions,
            args.rate,
            args.viewers,
            args.batch,
            args.settle_every,
            args.cycle,
            args.lease_ms,
            self.window_s,
            args.warmup.as_secs_f64()
        );
        s.push_str(&format!(
            "  connections: 1 maintainer + {} executor + {} viewer = {}\n",
            self.exec_conns,
            self.viewer_conns,
            1 + self.exec_conns + self.viewer_conns
        ));
        s.push_str(&format!(
            "  setup: connect {:.1} s, sessions {:.1} s, subscribe/register/grant/claim {:.1} s, first turns reserved {:.1} s\n",
            self.connect_s, self.sessions_s, self.claims_s, self.turns_s
        ));
        s.push_str(&format!(
            "  emits: {:.0}/s sustained of {:.0}/s offered ({} in the window, {} in all)\n",
            self.emits_per_s(),
            offered,
            self.window_emits,
            self.emits_total
        ));
        s.push_str(&format!(
            "  emit reply: {}\n",
            q_human(self.emit_reply.as_ref())
        ));
        s.push_str(&format!(
            "  emit→subscriber: {}\n",
            q_human(self.deliver.as_ref())
        ));
        s.push_str(&format!(
            "  deliveries: {} of {} expected\n",
            self.deliveries_received, self.deliveries_expected
        ));
        s.push_str(&format!(
            "  renew reply: {}; {} renewals, longest gap between two answered renewals {:.0} ms\n",
            q_human(self.renew.as_ref()),
            self.renewals,
            self.max_renew_gap_ms
        ));
        s.push_str(&format!(
            "  turn cycle (settle sent → next turn reserved): {}; {} settles, {} turns started by the maintainer\n",
            q_human(self.cycle.as_ref()),
            self.settles,
            self.turns_started
        ));
        s.push_str(&format!(
            "  tool's emit schedule lag: {}\n",
            q_human(self.lag.as_ref())
        ));
        s.push_str(&format!(
            "  leases lost: {} (leaseChanged with lease null {}, -32040 answers {}); executors stopped {}\n",
            self.leases_lost(),
            self.lease_changed_null,
            self.stale_answers,
            self.dead_executors
        ));
        s.push_str(&format!("  errors by code: {:?}\n", self.errors));
        for e in &self.error_samples {
            s.push_str(&format!("    {e}\n"));
        }
        s.push_str(&format!(
            "  host RSS: before setup {}, after setup {}, after the run {}\n",
            mib(self.rss_before_kib),
            mib(self.rss_setup_kib),
            mib(self.rss_after_kib)
        ));
        s.push_str(&format!(
            "  CPU in the window: host {}%, tool {}%, stolen {} ms\n",
            opt_f(self.host_cpu_pct),
            opt_f(self.tool_cpu_pct),
            opt_f(self.steal_ms)
        ));
        s.push_str(&format!(
            "  verdict: {}",
            if !self.invariants_hold() {
                format!("BROKEN: {}", self.broken())
            } else if self.sustained(args) {
                format!(
                    "sustained (≥95% of offered emits, p99 emit→subscriber ≤ {} ms, no lease lost, no error)",
                    args.p99_target.as_millis()
                )
            } else {
                format!(
                    "not sustained (emits below 95% of offered or p99 emit→subscriber over {} ms)",
                    args.p99_target.as_millis()
                )
            }
        ));
        s
    }

    pub fn json(&self, args: &Args) -> String {
        let errors: Vec<String> = self
            .errors
            .iter()
            .map(|(c, n)| format!("\"{c}\":{n}"))
            .collect();
        format!(
            "{{\"sessions\":{},\"rate\":{},\"viewers\":{},\"batch\":{},\"settle_every\":{},\"cycle\":\"{:?}\",\
             \"lease_ms\":{},\"window_s\":{:.3},\"exec_conns\":{},\"viewer_conns\":{},\
             \"connect_s\":{:.2},\"sessions_s\":{:.2},\"claims_s\":{:.2},\"turns_s\":{:.2},\
             \"offered_per_s\":{:.1},\"emits_per_s\":{:.1},\"window_emits\":{},\"emits_total\":{},{},{},{},{},{},\
             \"deliveries_expected\":{},\"deliveries_received\":{},\"unanswered\":{},\"settles\":{},\
             \"turns_started\":{},\"renewals\":{},\"max_renew_gap_ms\":{:.1},\"leases_lost\":{},\
             \"lease_changed_null\":{},\"stale_answers\":{},\"dead_executors\":{},\"errors\":{{{}}},\
             \"error_answers\":{},\"rss_before_kib\":{},\"rss_setup_kib\":{},\"rss_after_kib\":{},\
             \"host_cpu_pct\":{},\"tool_cpu_pct\":{},\"steal_ms\":{},\"invariants_hold\":{},\"sustained\":{},\
             \"fatal\":{}}}",
            args.sessions,
            args.rate,
            args.viewers,
            args.batch,
            args.settle_every,
            args.cycle,
            args.lease_ms,
            self.window_s,
            self.exec_conns,
            self.viewer_conns,
            self.connect_s,
            self.sessions_s,
            self.claims_s,
            self.turns_s,
            f64::from(args.sessions) * args.rate,
            self.emits_per_s(),
            self.window_emits,
            self.emits_total,
            q_json("emit_reply", self.emit_reply.as_ref()),
            q_json("deliver", self.deliver.as_ref()),
            q_json("renew", self.renew.as_ref()),
            q_json("cycle", self.cycle.as_ref()),
            q_json("lag", self.lag.as_ref()),
            self.deliveries_expected,
            self.deliveries_received,
            self.unanswered,
            self.settles,
            self.turns_started,
            self.renewals,
            self.max_renew_gap_ms,
            self.leases_lost(),
            self.lease_changed_null,
            self.stale_answers,
            self.dead_executors,
            errors.join(","),
            self.error_answers(),
            opt(self.rss_before_kib),
            opt(self.rss_setup_kib),
            opt(self.rss_after_kib),
            opt_f(self.host_cpu_pct),
            opt_f(self.tool_cpu_pct),
            opt_f(self.steal_ms),
            self.invariants_hold(),
            self.sustained(args),
            self.fatal.as_ref().map_or("null".to_owned(), |f| json_string(f)),
        )
    }
}

/// `s` as a JSON string.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::json_string;

    #[test]
    fn json_strings_round_trip() {
        for s in [
            "plain",
            "a \"quote\" and \\ back",
            "line\nbreak\t\u{1}",
            "µs → ok",
        ] {
            let v: serde_json::Value = serde_json::from_str(&json_string(s)).expect("valid JSON");
            assert_eq!(v, s);
        }
    }
}
