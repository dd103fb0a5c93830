//! `axhost`: run the host, manage its credentials.
//!
//! Contract scripts and tests rely on:
//! - `axhost serve [--listen ADDR] [--data-dir DIR]` prints, once it accepts connections, exactly
//!   one line `axhost listening on ws://IP:PORT/axp`, plus `connect: ws://IP:PORT/axp?tkn=TOKEN`
//!   the one time it created the first credential. It exits 0 after SIGINT or SIGTERM.
//! - `axhost token add --id ID --role ROLE [--sessions URI,...]` prints the new token as its last
//!   stdout line; `token list` prints `id role sessions` lines (never tokens); `token revoke`.
//! - `axhost services [--once]`, `axhost call SERVICE METHOD JSON`, `axhost notify SERVICE METHOD
//!   JSON` talk to a running host's client services (contract in `client_cmds.rs`).
//! - Any failure: exit status non-zero and one line `axhost: <error>` on stderr.
//!
//! Logs go to stderr through `tracing` (filter with `RUST_LOG`, default `info`).

use std::cell::Cell;
use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use axhost_core::{session_id_from_scope_entry, Host, HostConfig, Role, SessionScope};
use axhost_io::server::{serve, ServeOptions};
use axhost_io::{config, datadir, Credentials, SqliteStore};
use clap::{Parser, Subcommand};

mod client_cmds;

/// Where `serve` listens when neither the flag nor the config says otherwise.
const DEFAULT_LISTEN: &str = "127.0.0.1:7331";

#[derive(Parser)]
#[command(name = "axhost", version, about = "A host for the Agent Host Protocol")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the host until SIGINT or SIGTERM.
    Serve {
        /// Address to listen on (`127.0.0.1:0` picks a free port). Default: the config's
        /// `listen`, else 127.0.0.1:7331.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Data directory (database and axhost.toml). Default: $AXHOST_DATA_DIR, else
        /// $XDG_DATA_HOME/axhost, else ~/.local/share/axhost.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Manage transport credentials.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Watch the client-service catalog: the snapshot, then each change, one JSON line each.
    Services {
        #[command(flatten)]
        connect: client_cmds::Connect,
        /// Print the snapshot and exit.
        #[arg(long)]
        once: bool,
    },
    /// Send a request to a client service and print its result (JSON-RPC error: exit 1).
    Call {
        #[command(flatten)]
        connect: client_cmds::Connect,
        /// Service id, or the label or protocol of exactly one visible service.
        service: String,
        /// Application method.
        method: String,
        /// Params, as JSON.
        json: String,
        /// How long the host waits for the service (ms); default the host's (30 s).
        #[arg(long)]
        timeout_ms: Option<u64>,
    },
    /// Send a notification to a client service (fire and forget: nothing comes back).
    Notify {
        #[command(flatten)]
        connect: client_cmds::Connect,
        /// Service id, or the label or protocol of exactly one visible service.
        service: String,
        /// Application method.
        method: String,
        /// Params, as JSON.
        json: String,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a principal and print its new token (last stdout line). Only its digest is kept.
    Add {
        /// Data directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Principal id.
        #[arg(long)]
        id: String,
        /// maintainer | contributor | verifier | observer.
        #[arg(long)]
        role: String,
        /// `*` or comma-separated session URIs (`ahp-session:/ID`, `axp-session:/ID`, or `ID`).
        #[arg(long, default_value = "*")]
        sessions: String,
    },
    /// List principals: id, role, sessions. Tokens are never shown.
    List {
        /// Data directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Remove a principal; its token stops working at the next host start.
    Revoke {
        /// Data directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Principal id.
        #[arg(long)]
        id: String,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.to_string();
            let line = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("axhost: {}", line.strip_prefix("error: ").unwrap_or(line));
            return ExitCode::from(2);
        }
    };
    init_logging();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::debug!("exiting with an error");
            eprintln!("axhost: {message}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // tungstenite logs frames and messages, payloads included, at debug and trace (through the
    // `log` bridge). Payloads never reach our logs, whatever RUST_LOG says.
    if let Ok(directive) = "tungstenite=info".parse() {
        filter = filter.add_directive(directive);
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Serve { listen, data_dir } => run_serve(listen, data_dir_or_default(data_dir)),
        Command::Token { command } => run_token(command),
        Command::Services { connect, once } => client_cmds::services(&connect, once),
        Command::Call {
            connect,
            service,
            method,
            json,
            timeout_ms,
        } => client_cmds::call(&connect, &service, &method, &json, timeout_ms),
        Command::Notify {
            connect,
            service,
            method,
            json,
        } => client_cmds::notify(&connect, &service, &method, &json),
    }
}

fn data_dir_or_default(dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(datadir::default_data_dir)
}

fn run_serve(listen: Option<SocketAddr>, dir: PathBuf) -> Result<(), String> {
    datadir::ensure_data_dir(&dir).map_err(|e| format!("data directory {}: {e}", dir.display()))?;
    // The repository comes from the config (read only here; a missing file is the default), so
    // the store can check it against the database's binding as it opens.
    let repository = config::load(&dir)
        .map_err(|e| e.to_string())?
        .repository()
        .to_owned();
    // The store's owner lock comes before anything is written: a second host on this directory
    // stops here, before it could create a credential. So does a host configured for another
    // repository than the one the database belongs to.
    let store =
        SqliteStore::open(&datadir::db_path(&dir), &repository).map_err(|e| e.to_string())?;
    let new_token = datadir::bootstrap(&dir).map_err(|e| e.to_string())?;
    let ready = Cell::new(false);
    let result = serve_store(listen, &dir, store, new_token.as_deref(), &ready);
    if result.is_err() && !ready.get() && new_token.is_some() {
        // Nobody saw the first credential's token: take it back, so the next start creates
        // (and prints) a fresh one instead of leaving a credential no one can use.
        if let Err(e) = datadir::token_revoke(&dir, datadir::BOOTSTRAP_ID) {
            tracing::warn!(error = %e, "could not remove the unannounced first credential");
        }
    }
    result
}

/// Builds the host over `store` and serves until a signal. Sets `ready` once the address lines
/// are printed.
fn serve_store(
    listen: Option<SocketAddr>,
    dir: &Path,
    store: SqliteStore,
    new_token: Option<&str>,
    ready: &Cell<bool>,
) -> Result<(), String> {
    let cfg = config::load(dir).map_err(|e| e.to_string())?;
    let default_listen: SocketAddr = DEFAULT_LISTEN.parse().map_err(|_| "bad default address")?;
    let listen = listen.or(cfg.listen).unwrap_or(default_listen);
    let seed = host_seed();
    tracing::debug!(seed, "host seed");
    if cfg.repository() != store.repository() {
        // The file changed between the two reads (bootstrap rewrites it); never serve a
        // repository the database is not bound to.
        return Err(format!(
            "{}: repository changed to {:?} while starting (the database is bound to {:?})",
            config::config_path(dir).display(),
            cfg.repository(),
            store.repository()
        ));
    }
    let repository = store.repository().to_owned();
    let host_config = HostConfig {
        limits: cfg.limits.clone(),
        trust_groups: cfg.trust_groups.clone(),
        repository: repository.clone(),
        ..HostConfig::default()
    };
    // The writer thread commits through one connection; the loop reads through the other.
    let (reads, writes) = store.split();
    let host = Host::new(host_config, reads, seed).map_err(|e| e.to_string())?;
    tracing::info!(
        data_dir = %dir.display(),
        repository,
        principals = cfg.principals.len(),
        "host ready"
    );
    let opts = ServeOptions {
        listen,
        credentials: Credentials::new(&cfg.principals),
        allowed_origins: cfg.allowed_origins.clone(),
        keepalive_ms: cfg.keepalive(),
        busy_poll_us: cfg.busy_poll(),
        coalesce_us: cfg.coalesce(),
        writer_spin_us: cfg.writer_spin(),
        driver_limits: cfg.driver_limits.clone(),
    };
    serve(host, writes, opts, |addr| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "axhost listening on ws://{addr}/axp");
        if let Some(token) = new_token {
            let _ = writeln!(out, "connect: ws://{addr}/axp?tkn={token}");
        }
        let _ = out.flush();
        ready.set(true);
    })
    .map_err(|e| format!("serving on {listen}: {e}"))
}

/// The host's seed: every id it generates derives from it, so it comes from the OS, fresh each
/// start. Falls back to the thread CSPRNG (itself OS-seeded) if the OS source fails once.
fn host_seed() -> u64 {
    use rand::TryRngCore;
    rand::rngs::OsRng
        .try_next_u64()
        .unwrap_or_else(|_| rand::random())
}

fn run_token(command: TokenCommand) -> Result<(), String> {
    match command {
        TokenCommand::Add {
            data_dir,
            id,
            role,
            sessions,
        } => {
            let role = Role::parse(&role).ok_or_else(|| {
                format!("unknown role {role:?} (maintainer, contributor, verifier or observer)")
            })?;
            let scope = parse_sessions(&sessions)?;
            let token = datadir::token_add(&data_dir_or_default(data_dir), &id, role, scope)
                .map_err(|e| e.to_string())?;
            println!("{token}");
            Ok(())
        }
        TokenCommand::List { data_dir } => {
            let rows =
                datadir::token_list(&data_dir_or_default(data_dir)).map_err(|e| e.to_string())?;
            for (id, role, sessions) in rows {
                println!("{id}\t{role}\t{sessions}");
            }
            Ok(())
        }
        TokenCommand::Revoke { data_dir, id } => {
            datadir::token_revoke(&data_dir_or_default(data_dir), &id)
                .map_err(|e| e.to_string())?;
            println!("revoked {id}");
            Ok(())
        }
    }
}

/// `*` or a comma-separated list of session URIs or ids.
fn parse_sessions(text: &str) -> Result<SessionScope, String> {
    if text.trim() == "*" {
        return Ok(SessionScope::All);
    }
    let mut ids = BTreeSet::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let id = session_id_from_scope_entry(entry)
            .ok_or_else(|| format!("invalid session {entry:?} (expected ahp-session:/ID or *)"))?;
        ids.insert(id.to_owned());
    }
    if ids.is_empty() {
        return Err("--sessions needs `*` or at least one session URI".to_owned());
    }
    Ok(SessionScope::Only(ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_parse_star_lists_and_refuse_junk() {
        assert_eq!(parse_sessions("*"), Ok(SessionScope::All));
        let want: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        assert_eq!(
            parse_sessions("ahp-session:/a, axp-session:/b"),
            Ok(SessionScope::Only(want))
        );
        assert!(parse_sessions("").is_err());
        assert!(parse_sessions("ahp-session:/").is_err());
    }
}
