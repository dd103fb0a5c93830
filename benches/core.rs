//! Core-only benchmarks: the sans-IO host with no sockets, so the numbers are the host's own
//! cost per message. Run: `cargo bench --bench core`.
//!
//! - `notification/route`: parse one ~200-byte `clientService/notify`, look the service up,
//!   build the forwarded frame, queue it, account its flush and recycle it, as the driver does
//!   (the canonical layout).
//! - `notification/route_general`: the same with the params' members in another order, which
//!   the general envelope parser reads.
//! - `request/roundtrip`: `clientService/request` → `handleRequest` → response → result.
//! - `catalog/fanout_100`: register and unregister a service with 100 catalog observers.
//! - `dispatch/turn_10_subscribers`: a maintainer's `chat/turnStarted` + `chat/turnCancelled`
//!   with 10 chat subscribers (the durable path, over the in-memory store).
//!
//! The core commits nothing itself: each change comes out as `Output::Commit`, and the shared
//! drive loop (`drive::Drive::immediate`) commits it at once on the host's `MemStore` and
//! reports it durable, so the frames it held come out of the same drain. The benches that make
//! changes (`dispatch`, and `catalog` once per reserved block of catalog numbers) therefore
//! measure what they did before (the change applied and stored, the events fanned out) plus
//! holding the events until the commit is reported and releasing them: the whole synchronous
//! write path, with the writer's commit on the same thread.

use std::hint::black_box;
use std::sync::Arc;

use axhost_core::drive::Drive;
use axhost_core::{
    ConnId, Frame, Host, HostConfig, Input, Instant, MemStore, Now, Output, Principal,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};

const CATALOG: &str = "x-client-services://";

struct Bench {
    host: Host<MemStore>,
    /// The shared drive loop: commits each change as it comes out, on the host's own store,
    /// and reports each frame flushed.
    drive: Drive,
    /// The frames one drain sent, handed back to the host after it.
    sent: Vec<Frame>,
    ms: u64,
}

impl Bench {
    fn new() -> Bench {
        Bench {
            host: Host::new(HostConfig::default(), MemStore::new(), 1).expect("host"),
            drive: Drive::immediate().close_at_once(false),
            sent: Vec::new(),
            ms: 1,
        }
    }

    fn now(&mut self) -> Now {
        Now {
            mono: Instant(self.ms),
            wall_unix_ms: 1_700_000_000_000 + self.ms,
        }
    }

    /// Feeds one message, drains every output (committing each change at once, acknowledging
    /// each frame as flushed, then recycling it like the driver) and hands each frame to
    /// `seen`. Returns how many frames went out.
    fn feed(&mut self, conn: u64, text: &str, mut seen: impl FnMut(&Frame)) -> usize {
        let now = self.now();
        self.host.handle(
            now,
            Input::Message {
                conn: ConnId(conn),
                text,
            },
        );
        let sent = &mut self.sent;
        self.drive.drain(&mut self.host, now, |out| {
            if let Output::Send { frame, .. } = out {
                seen(&frame);
                sent.push(frame);
            }
        });
        let frames = self.sent.len();
        // As the driver does once the bytes are copied out: the buffers serve the next
        // forwarded notifications instead of going back to the allocator.
        for frame in self.sent.drain(..) {
            self.host.recycle(frame);
        }
        frames
    }

    fn send(&mut self, conn: u64, text: &str) -> usize {
        self.feed(conn, text, |_| {})
    }

    /// The last frame the message caused, parsed.
    fn last_frame(&mut self, conn: u64, text: &str) -> Value {
        let mut last = Value::Null;
        self.feed(conn, text, |f| {
            last = serde_json::from_slice(f.as_bytes()).expect("json")
        });
        last
    }

    fn client(&mut self, conn: u64, subs: &[&str]) {
        let now = self.now();
        let principal = Arc::new(Principal::maintainer("bench"));
        self.host.handle(
            now,
            Input::Connected {
                conn: ConnId(conn),
                principal,
            },
        );
        let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":format!("c{conn}"),"initialSubscriptions":subs}});
        self.send(conn, &init.to_string());
    }

    fn register(&mut self, conn: u64) -> String {
        let msg = json!({"jsonrpc":"2.0","id":2,"method":"client/registerService","params":{"channel":CATALOG,"metadata":{"protocol":"bench"}}});
        let mut id = String::new();
        self.feed(conn, &msg.to_string(), |f| {
            let v: Value = serde_json::from_slice(f.as_bytes()).expect("json");
            if let Some(s) = v["result"]["serviceId"].as_str() {
                id = s.to_owned();
            }
        });
        id
    }
}

fn notification(c: &mut Criterion) {
    let mut b = Bench::new();
    b.client(1, &[]);
    b.client(2, &[]);
    let id = b.register(1);
    let payload = format!(
        r#"{{"seq":1,"sentAtNs":1700000000000000000,"data":"{}"}}"#,
        "x".repeat(140)
    );
    let msg = format!(
        r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{{"channel":"{CATALOG}","serviceId":"{id}","method":"tick","params":{payload}}}}}"#
    );
    assert_eq!(b.send(2, &msg), 1, "one forwarded frame");
    // The same notify with its members in other orders: no fast path applies, so this is the
    // general envelope parser plus one pass over the params.
    let general = format!(
        r#"{{"method":"clientService/notify","jsonrpc":"2.0","params":{{"channel":"{CATALOG}","method":"tick","params":{payload},"serviceId":"{id}"}}}}"#
    );
    assert_eq!(b.send(2, &general), 1, "one forwarded frame");
    let mut g = c.benchmark_group("notification");
    g.throughput(Throughput::Elements(1));
    g.bench_function("route", |bench| {
        bench.iter(|| black_box(b.send(2, black_box(msg.as_str()))))
    });
    g.bench_function("route_general", |bench| {
        bench.iter(|| black_box(b.send(2, black_box(general.as_str()))))
    });
    g.finish();
}

fn request(c: &mut Criterion) {
    let mut b = Bench::new();
    b.client(1, &[]);
    b.client(2, &[]);
    let id = b.register(1);
    let msg = json!({"jsonrpc":"2.0","id":7,"method":"clientService/request","params":{"channel":CATALOG,"serviceId":id,"method":"get","params":{"k":"v"}}}).to_string();
    let mut g = c.benchmark_group("request");
    g.throughput(Throughput::Elements(1));
    g.bench_function("roundtrip", |bench| {
        bench.iter(|| {
            let forwarded = b.last_frame(2, &msg);
            let host_id = forwarded["id"].as_u64().expect("host id");
            let response = format!(r#"{{"jsonrpc":"2.0","id":{host_id},"result":{{"v":1}}}}"#);
            black_box(b.send(1, &response))
        })
    });
    g.finish();
}

fn catalog(c: &mut Criterion) {
    let mut b = Bench::new();
    b.client(1, &[]);
    for conn in 10..110 {
        b.client(conn, &[CATALOG]);
    }
    let mut g = c.benchmark_group("catalog");
    g.throughput(Throughput::Elements(2));
    g.bench_function("fanout_100", |bench| {
        bench.iter(|| {
            let id = b.register(1);
            let msg = json!({"jsonrpc":"2.0","id":3,"method":"client/unregisterService","params":{"channel":CATALOG,"serviceId":id}});
            black_box(b.send(1, &msg.to_string()))
        })
    });
    g.finish();
}

fn dispatch(c: &mut Criterion) {
    let mut b = Bench::new();
    b.client(1, &[]);
    let create = json!({"jsonrpc":"2.0","id":2,"method":"createSession","params":{"channel":"ahp-session:/bench"}});
    b.send(1, &create.to_string());
    for conn in 10..20 {
        b.client(conn, &["ahp-chat:/bench"]);
    }
    let turn = |seq: u64| {
        let turn = format!("t{seq}");
        let start = json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-chat:/bench","clientSeq":seq,"action":{"type":"chat/turnStarted","turnId":turn,"startedAt":"2026-01-01T00:00:00.000Z","message":{"text":"hi","origin":{"kind":"user"}}}}});
        let cancel = json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-chat:/bench","clientSeq":seq+1,"action":{"type":"chat/turnCancelled","turnId":turn,"duration":1}}});
        (start.to_string(), cancel.to_string())
    };
    // Each dispatch is one change, committed in the drain, and one event to each subscriber.
    let (start, cancel) = turn(2);
    assert_eq!(b.send(1, &start), 10, "one event per subscriber");
    assert_eq!(b.send(1, &cancel), 10, "one event per subscriber");
    assert_eq!(b.host.changes_in_flight(), 0, "every change committed");
    let mut seq = 2u64;
    let mut g = c.benchmark_group("dispatch");
    g.throughput(Throughput::Elements(2));
    g.bench_function("turn_10_subscribers", |bench| {
        bench.iter(|| {
            seq += 2;
            let (start, cancel) = turn(seq);
            b.send(1, &start);
            black_box(b.send(1, &cancel))
        })
    });
    g.finish();
}

criterion_group!(benches, notification, request, catalog, dispatch);
criterion_main!(benches);
