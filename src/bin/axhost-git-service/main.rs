//! `axhost-git-service`: serves git repositories on disk to other clients of an axhost, as one
//! client service speaking the `git-object-reader` protocol (see `docs/git-service.md`).
//!
//! ```text
//! axhost-git-service --url ws://127.0.0.1:7331/axp --token TOKEN --repo app=/src/app [--repo ...]
//!                    [--label NAME] [--client-id ID] [--poll-ms 1000] [--reconnect-attempts 10]
//! ```
//! `--url` and `--token` default to `$AXHOST_URL` and `$AXHOST_TOKEN` (the URL may carry the
//! token as `?tkn=`). Once registered it prints `registered SERVICE_ID` on stdout (again after
//! each reconnect, with a new id). When the host goes away it reconnects with exponential
//! backoff (0.2 s doubling to 5 s) and gives up after `--reconnect-attempts` reconnection
//! attempts in a row fail (exit 1). A refused token, or an error answer to `initialize` or registration, exits 1 at
//! once. SIGTERM or SIGINT: unregister, close, exit 0.

mod repo;
mod sidecar;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axhost_io::client::{default_client_id, token_in_url, Client, ClientError};
use clap::Parser;

use crate::repo::Repo;
use crate::sidecar::{Ended, Sidecar};

#[derive(Parser)]
#[command(
    name = "axhost-git-service",
    version,
    about = "Serve git repositories to other axhost clients (protocol git-object-reader)"
)]
struct Args {
    /// Host WebSocket URL, e.g. ws://127.0.0.1:7331/axp (may carry ?tkn=TOKEN).
    #[arg(long, env = "AXHOST_URL")]
    url: String,
    /// Bearer token (sent in the Authorization header).
    #[arg(long, env = "AXHOST_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Client id to initialize with. Default: git-service-<12 hex digits of the token's SHA-256>.
    #[arg(long)]
    client_id: Option<String>,
    /// A repository to serve, as NAME=PATH (repeatable).
    #[arg(long = "repo", value_name = "NAME=PATH", required = true)]
    repos: Vec<String>,
    /// Human-readable label in the service metadata.
    #[arg(long, default_value = "git")]
    label: String,
    /// How often to look for ref changes for subscribed listeners (ms).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    poll_ms: u64,
    /// Reconnection attempts after a failure (each one failing in turn) before giving up.
    #[arg(long, default_value_t = 10)]
    reconnect_attempts: u32,
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("axhost-git-service: {message}");
            ExitCode::FAILURE
        }
    }
}

fn open_repos(specs: &[String]) -> Result<BTreeMap<String, Repo>, String> {
    let mut repos = BTreeMap::new();
    for spec in specs {
        let (name, path) = spec
            .split_once('=')
            .ok_or_else(|| format!("--repo {spec:?}: expected NAME=PATH"))?;
        if name.is_empty() || path.is_empty() {
            return Err(format!("--repo {spec:?}: expected NAME=PATH"));
        }
        let repo = Repo::open(&PathBuf::from(path))?;
        if repos.insert(name.to_owned(), repo).is_some() {
            return Err(format!("--repo: {name:?} named twice"));
        }
    }
    Ok(repos)
}

fn run(args: Args) -> Result<(), String> {
    let repos = open_repos(&args.repos)?;
    let token = args.token.clone().or_else(|| token_in_url(&args.url));
    let client_id = args
        .client_id
        .clone()
        .unwrap_or_else(|| default_client_id("git-service", token.as_deref()));
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone())
            .map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    let mut sidecar = Sidecar::new(
        repos,
        args.label.clone(),
        client_id,
        Duration::from_millis(args.poll_ms),
    );
    let metadata_len = sidecar.metadata().to_string().len();
    if metadata_len > 4096 {
        return Err(format!(
            "the service metadata would be {metadata_len} bytes, over the host's 4 KiB: serve fewer \
             or shorter repo names per process"
        ));
    }
    let mut failures: u32 = 0;
    loop {
        let mut registered = false;
        let result = Client::connect(&args.url, args.token.as_deref()).and_then(|mut client| {
            let r = sidecar.serve(&mut client, &stop, &mut |id| {
                registered = true;
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "registered {id}");
                let _ = out.flush();
            });
            client.close();
            r
        });
        match result {
            Ok(Ended::Stopped) => return Ok(()),
            Err(_) if stop.load(Ordering::Relaxed) => return Ok(()),
            Err(e) if !registered && is_permanent(&e) => return Err(e.to_string()),
            Err(e) => {
                if registered {
                    failures = 0;
                }
                failures += 1;
                if failures > args.reconnect_attempts {
                    return Err(format!(
                        "giving up after {} reconnection attempts: {e}",
                        failures - 1
                    ));
                }
                let backoff = backoff(failures);
                eprintln!(
                    "axhost-git-service: {e}; reconnecting in {} ms (attempt {failures} of {})",
                    backoff.as_millis(),
                    args.reconnect_attempts
                );
                sleep_unless_stopped(backoff, &stop);
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
        }
    }
}

/// Errors no retry can fix: a bad URL, a refused credential, an error answer to our own
/// `initialize` or registration.
fn is_permanent(e: &ClientError) -> bool {
    match e {
        ClientError::Url(_) | ClientError::Rpc(_) => true,
        ClientError::Refused { status, .. } => matches!(status, 401 | 403),
        _ => false,
    }
}

/// 200 ms doubling per failure, capped at 5 s.
fn backoff(failures: u32) -> Duration {
    let ms = 200u64.saturating_mul(1 << failures.saturating_sub(1).min(10));
    Duration::from_millis(ms.min(5_000))
}

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(2), Duration::from_millis(400));
        assert_eq!(backoff(5), Duration::from_millis(3200));
        assert_eq!(backoff(6), Duration::from_secs(5));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn repo_specs_need_name_and_path() {
        assert!(open_repos(&["x".into()]).is_err());
        assert!(open_repos(&["=p".into()]).is_err());
        assert!(open_repos(&["n=".into()]).is_err());
    }
}
