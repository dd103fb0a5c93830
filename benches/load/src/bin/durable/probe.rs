//! Bare SQLite commits, one small row per transaction, back to back, with the host's pragmas
//! (`journal_mode=WAL`, `synchronous=FULL`; io/src/sqlite.rs): what the disk under DIR allows
//! when every commit waits for its own flush. One closed-loop writer whose every change is its
//! own commit cannot beat this rate, so a durable-write figure at one writer far above it means
//! the host answered before its change reached the disk (or DIR is on another disk).

use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rusqlite::Connection;

pub struct Report {
    pub dir: String,
    pub window_s: f64,
    pub commits: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Report {
    pub fn human(&self) -> String {
        format!(
            "sqlite probe in {}: {:.0} commits/s ({} in {:.1} s), commit p50 {:.1} µs p99 {:.1} µs max {:.1} µs",
            self.dir,
            self.commits as f64 / self.window_s,
            self.commits,
            self.window_s,
            self.p50_us,
            self.p99_us,
            self.max_us
        )
    }

    pub fn json(&self) -> String {
        format!(
            "{{\"probe\":\"sqlite\",\"window_s\":{:.3},\"commits\":{},\"commits_per_s\":{:.1},\
             \"commit_p50_us\":{:.1},\"commit_p99_us\":{:.1},\"commit_max_us\":{:.1}}}",
            self.window_s,
            self.commits,
            self.commits as f64 / self.window_s,
            self.p50_us,
            self.p99_us,
            self.max_us
        )
    }
}

pub fn run(dir: &Path, warmup: Duration, window: Duration) -> Result<Report, String> {
    let file = dir.join(format!("axhost-durable-probe-{}.db", std::process::id()));
    let result = measure(&file, warmup, window);
    // The database, its WAL and its shared-memory index.
    for suffix in ["", "-wal", "-shm"] {
        let mut path = file.clone().into_os_string();
        path.push(suffix);
        let _ = std::fs::remove_file(path);
    }
    let (commits, h) = result?;
    Ok(Report {
        dir: dir.display().to_string(),
        window_s: window.as_secs_f64(),
        commits,
        p50_us: h.value_at_quantile(0.50) as f64 / 1e3,
        p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
        max_us: h.max() as f64 / 1e3,
    })
}

fn measure(
    file: &Path,
    warmup: Duration,
    window: Duration,
) -> Result<(u64, Histogram<u64>), String> {
    let err = |e: rusqlite::Error| format!("sqlite probe {}: {e}", file.display());
    let mut conn = Connection::open(file).map_err(err)?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("sqlite probe: journal_mode is {mode}, not WAL"));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(err)?;
    conn.execute_batch("CREATE TABLE probe (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .map_err(err)?;
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .map_err(|e| format!("histogram: {e}"))?;
    // About what one dispatch's event record holds.
    let row = "x".repeat(200);
    let t0 = Instant::now();
    let (start, end) = (t0 + warmup, t0 + warmup + window);
    let mut commits = 0u64;
    loop {
        let began = Instant::now();
        if began >= end {
            break;
        }
        let tx = conn.transaction().map_err(err)?;
        tx.execute("INSERT INTO probe (v) VALUES (?1)", [&row])
            .map_err(err)?;
        tx.commit().map_err(err)?;
        let done = Instant::now();
        if began >= start && done < end {
            commits += 1;
            h.saturating_record((done - began).as_nanos() as u64);
        }
    }
    Ok((commits, h))
}
