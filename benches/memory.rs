//! Repository memory at scale: a host holding 100,000 accepted lessons of about 1 KB answers
//! `_axp/memorySearch` for realistic queries (a session's task: a sentence of common and
//! technical words, sometimes an identifier), timed one request at a time through the whole
//! request path (parse, scope, search, JSON answer), as a repository-wide caller and as one
//! scoped to a single session. Also the start-up cost: loading and indexing the lessons.
//!
//! Run: `cargo bench --bench memory` (or `-- LESSONS QUERIES`). A test-like binary, not
//! criterion: it reports percentiles of single requests, which is what a client waits.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant as Clock};

use axhost_core::canonical::hash_object;
use axhost_core::drive::Drive;
use axhost_core::{
    Change, Commit, ConnId, Host, HostConfig, Input, Instant, Limits, MemStore, Now, Output,
    Principal, Record, Role, SessionScope, Table,
};
use serde_json::{json, Value};

/// Sessions the evidence comes from.
const SESSIONS: u64 = 2_000;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const STOP: &[&str] = &[
    "the", "a", "to", "of", "and", "in", "is", "for", "on", "with", "when", "if", "it", "be",
    "that", "this", "not", "by", "or", "as", "before", "after", "from", "at", "an", "are", "do",
    "all", "can", "its", "only", "then", "so", "into", "than", "once", "each", "every",
];

const TECH: &[&str] = &[
    "parser",
    "cache",
    "retry",
    "upload",
    "config",
    "test",
    "build",
    "error",
    "timeout",
    "lock",
    "thread",
    "async",
    "request",
    "response",
    "buffer",
    "index",
    "query",
    "schema",
    "migration",
    "token",
    "session",
    "client",
    "server",
    "flaky",
    "deadlock",
    "memory",
    "leak",
    "panic",
    "unwrap",
    "api",
    "return",
    "types",
    "public",
    "stable",
    "version",
    "release",
    "branch",
    "commit",
    "merge",
    "conflict",
    "rebase",
    "lint",
    "format",
    "clippy",
    "warning",
    "deprecated",
    "dependency",
    "crate",
    "module",
    "import",
    "export",
    "serialize",
    "json",
    "yaml",
    "toml",
    "database",
    "sqlite",
    "transaction",
    "rollback",
    "durable",
    "fsync",
    "write",
    "read",
    "socket",
    "websocket",
    "handshake",
    "tls",
    "certificate",
    "auth",
    "permission",
    "scope",
    "role",
    "maintainer",
    "contributor",
    "review",
    "checkpoint",
    "lease",
    "epoch",
    "budget",
    "grant",
    "usage",
    "limit",
    "bound",
    "overflow",
    "underflow",
    "integer",
    "float",
    "string",
    "unicode",
    "utf8",
    "escape",
    "quote",
    "path",
    "file",
    "directory",
    "windows",
    "linux",
    "macos",
    "docker",
    "container",
    "image",
    "deploy",
    "rollout",
    "canary",
    "metrics",
    "logs",
    "trace",
    "span",
    "latency",
    "throughput",
    "benchmark",
    "profile",
    "allocation",
    "clone",
    "borrow",
    "lifetime",
    "trait",
    "generic",
    "macro",
    "closure",
    "iterator",
    "vector",
    "map",
    "hash",
    "sort",
    "search",
    "tokenize",
    "regex",
    "pattern",
    "match",
    "enum",
    "struct",
    "field",
    "method",
    "function",
    "callback",
    "promise",
    "future",
    "runtime",
    "executor",
    "scheduler",
    "queue",
    "channel",
    "backpressure",
    "shutdown",
    "signal",
    "restart",
    "crash",
    "recover",
    "snapshot",
    "replay",
    "reconnect",
    "heartbeat",
    "renew",
    "expire",
    "fence",
];

const SYLLABLES: &[&str] = &[
    "ka", "to", "ri", "po", "sen", "dar", "mi", "lo", "ver", "cha", "nu", "bel", "tra", "qui",
    "zo", "fen", "gra", "lin", "mos", "pe", "sta", "cor", "du", "ex", "vin", "ta", "rel", "om",
];

/// Ranked words (stop words, then technical words, then a tail of made-up words) and the
/// cumulative Zipf weights to draw them by.
struct Words {
    words: Vec<String>,
    cumulative: Vec<f64>,
}

impl Words {
    fn new(rng: &mut Rng, tail: usize) -> Words {
        let mut words: Vec<String> = STOP.iter().chain(TECH).map(|w| w.to_string()).collect();
        let mut seen: std::collections::BTreeSet<String> = words.iter().cloned().collect();
        while words.len() < STOP.len() + TECH.len() + tail {
            let n = 1 + rng.below(4);
            let w: String = (0..n)
                .map(|_| SYLLABLES[rng.below(SYLLABLES.len() as u64) as usize])
                .collect();
            if seen.insert(w.clone()) {
                words.push(w);
            }
        }
        let mut total = 0.0;
        let cumulative = (1..=words.len())
            .map(|rank| {
                total += 1.0 / (rank as f64).powf(1.05);
                total
            })
            .collect();
        Words { words, cumulative }
    }

    fn word(&self, rng: &mut Rng) -> &str {
        let total = *self.cumulative.last().unwrap_or(&1.0);
        let x = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let i = self.cumulative.partition_point(|c| *c < x);
        &self.words[i.min(self.words.len() - 1)]
    }

    /// `n` words, with now and then an identifier, a number or a path, as prose about code has.
    fn text(&self, rng: &mut Rng, n: u64) -> String {
        let mut out = String::new();
        for i in 0..n {
            if i > 0 {
                out.push(if rng.below(12) == 0 { ',' } else { ' ' });
                if out.ends_with(',') {
                    out.push(' ');
                }
            }
            match rng.below(30) {
                0 => {
                    let (a, b) = (self.word(rng).to_owned(), self.word(rng).to_owned());
                    out.push_str(&format!("{a}_{b}"));
                }
                1 => out.push_str(&format!("v{}.{}", rng.below(5), rng.below(20))),
                2 => {
                    let (a, b) = (self.word(rng).to_owned(), self.word(rng).to_owned());
                    out.push_str(&format!("src/{a}/{b}.rs"));
                }
                3 => {
                    let w = self.word(rng);
                    let mut c = w.chars();
                    if let Some(f) = c.next() {
                        out.extend(f.to_uppercase());
                        out.push_str(c.as_str());
                    }
                }
                _ => out.push_str(self.word(rng)),
            }
        }
        out
    }
}

fn now(ms: u64) -> Now {
    Now {
        mono: Instant(ms),
        wall_unix_ms: 1_700_000_000_000 + ms,
    }
}

/// Resident memory of this process, in bytes (Linux; 0 elsewhere).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// A store holding `n` accepted lessons; their average text length.
fn store_with_lessons(rng: &mut Rng, words: &Words, n: u64) -> (MemStore, usize) {
    let mut records = Vec::with_capacity(n as usize);
    let mut text_bytes = 0;
    for i in 0..n {
        let n = 4 + rng.below(5);
        let title = words.text(rng, n);
        let n = 10 + rng.below(16);
        let trigger = words.text(rng, n);
        let n = 100 + rng.below(60);
        let lesson = words.text(rng, n);
        text_bytes += title.len() + trigger.len() + lesson.len() + 2;
        let outcome = if i % 3 == 0 { "failure" } else { "success" };
        let content = json!({"scope": "default", "title": title, "trigger": trigger,
                             "lesson": lesson, "outcome": outcome});
        let id = hash_object(&content);
        let evidence: Vec<Value> = (0..1 + rng.below(2))
            .map(|_| {
                let s = rng.below(SESSIONS);
                json!({"session": format!("ahp-session:/s{s}"), "fromSeq": 1, "toSeq": 2,
                       "gitHead": null})
            })
            .collect();
        let mut entry = content;
        entry["id"] = json!(id);
        entry["revision"] = json!(2);
        entry["evidence"] = json!(evidence);
        entry["status"] = json!("accepted");
        entry["author"] = json!("alice");
        records.push(Record::json(Table::Memory, id, &entry.to_string()));
    }
    let mut store = MemStore::new();
    let change = Change {
        number: 1,
        records,
        ..Change::default()
    };
    store.commit(&change).expect("commit");
    (store, text_bytes / n.max(1) as usize)
}

/// Carries out every output through the shared drive loop (changes committed at once, frames
/// flushed); the last frame sent, parsed.
fn drain(host: &mut Host<MemStore>, ms: u64) -> Value {
    let mut last = Value::Null;
    Drive::immediate().drain(host, now(ms), |out| {
        if let Output::Send { frame, .. } = out {
            last = serde_json::from_slice(frame.as_bytes()).expect("json");
        }
    });
    last
}

fn connect(host: &mut Host<MemStore>, conn: u64, principal: Principal, ms: &mut u64) {
    *ms += 1;
    host.handle(
        now(*ms),
        Input::Connected {
            conn: ConnId(conn),
            principal: Arc::new(principal),
        },
    );
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":format!("c{conn}")}});
    *ms += 1;
    host.handle(
        now(*ms),
        Input::Message {
            conn: ConnId(conn),
            text: &init.to_string(),
        },
    );
    let answer = drain(host, *ms);
    assert!(answer["result"].is_object(), "initialize: {answer}");
}

/// One search answered: its wall time and the answer's `total`.
fn search(host: &mut Host<MemStore>, conn: u64, query: &str, ms: &mut u64) -> (Duration, u64) {
    let msg = json!({"jsonrpc":"2.0","id":2,"method":"_axp/memorySearch",
                     "params":{"channel":"ahp-root://","query":query}})
    .to_string();
    *ms += 1;
    let start = Clock::now();
    host.handle(
        now(*ms),
        Input::Message {
            conn: ConnId(conn),
            text: &msg,
        },
    );
    let answer = drain(host, *ms);
    let elapsed = start.elapsed();
    let total = answer["result"]["total"]
        .as_u64()
        .unwrap_or_else(|| panic!("not a search result: {answer}"));
    (elapsed, total)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(name: &str, mut times: Vec<Duration>, totals: &[u64]) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mean_total = totals.iter().sum::<u64>() as f64 / totals.len().max(1) as f64;
    println!(
        "{name:<28} n={:<5} p50 {:>7.3} ms  p90 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms  (mean total {mean_total:.0})",
        times.len(),
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.9)),
        ms(percentile(&times, 0.99)),
        ms(*times.last().unwrap_or(&Duration::ZERO)),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; numbers are ours.
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let lessons = args.first().copied().unwrap_or(100_000);
    let queries = args.get(1).copied().unwrap_or(2_000);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let words = Words::new(&mut rng, 30_000);

    let (store, avg_text) = store_with_lessons(&mut rng, &words, lessons);
    let before = rss();
    let start = Clock::now();
    let config = HostConfig {
        limits: Limits {
            memory_lessons_max: lessons.max(1) as u32,
            ..Limits::default()
        },
        ..HostConfig::default()
    };
    let mut host = Host::new(config, store, 1).expect("host");
    let loaded = start.elapsed();
    let after = rss();
    println!(
        "{lessons} accepted lessons, ~{avg_text} bytes of text each: host start (load + index) {:.2} s, RSS +{:.0} MB ({:.1} KB a lesson, the store's copy of the records excluded)",
        loaded.as_secs_f64(),
        after.saturating_sub(before) as f64 / 1e6,
        after.saturating_sub(before) as f64 / 1e3 / lessons.max(1) as f64,
    );

    let mut ms = 0;
    connect(&mut host, 1, Principal::maintainer("m"), &mut ms);
    let scoped = Principal {
        id: "carl".into(),
        role: Role::Contributor,
        sessions: SessionScope::Only(["s7".to_owned()].into()),
    };
    connect(&mut host, 2, scoped, &mut ms);

    let tasks: Vec<String> = (0..queries)
        .map(|_| {
            let n = 6 + rng.below(9);
            let mut t = words.text(&mut rng, n);
            if let Some(f) = t.get(..1) {
                t = f.to_uppercase() + &t[1..];
            }
            t
        })
        .collect();
    // Warm up: the first search allocates the per-query scratch at full size.
    black_box(search(&mut host, 1, &tasks[0], &mut ms));
    for (name, conn) in [
        ("repository-wide caller", 1),
        ("caller scoped to 1 session", 2),
    ] {
        let (times, totals): (Vec<Duration>, Vec<u64>) = tasks
            .iter()
            .map(|q| search(&mut host, conn, q, &mut ms))
            .unzip();
        report(name, times, &totals);
    }
    // Edge cases, a few times each.
    let longest: String = (0..1200)
        .map(|i| words.words[i % words.words.len()].as_str())
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(4096)
        .collect();
    for (name, q) in [
        ("query without tokens", "?!".to_owned()),
        ("one letter: \"e\"", "e".to_owned()),
        ("4,096 characters", longest),
    ] {
        let (times, totals): (Vec<Duration>, Vec<u64>) =
            (0..20).map(|_| search(&mut host, 1, &q, &mut ms)).unzip();
        report(name, times, &totals);
    }
}
