//! The host configuration file, `DIR/axhost.toml`: listen address, Origin allow-list, limits,
//! tuning, principals (with token digests) and trust groups.
//!
//! ```toml
//! listen = "127.0.0.1:7331"          # optional
//! repository = "acme/widgets"        # optional, default "default"; bound to the database on
//!                                    #   first start, another name later is refused
//! allowed_origins = ["https://x"]    # optional; absent = any Origin
//! keepalive_ms = 30000               # optional; ping a silent WebSocket, close it after 2x; 0 = off
//! [limits]                           # optional; any field of axhost_core::Limits or of
//! subscriptions_per_conn_max = 256   #   axhost_io::server::DriverLimits
//! pre_auth_sockets_max = 1024
//! [tuning]                           # optional; speed, never correctness
//! busy_poll_us = 50                  # poll this long before sleeping under load; 0 = off
//! coalesce_us = 20                   # starting gap before each turn while saturated by unbatched peers; 0 = off
//! writer_spin_us = 200               # the writer polls its queue this long when changes come that close; 0 = off
//! [[principal]]
//! id = "alice"
//! role = "maintainer"                # maintainer | contributor | verifier | observer
//! sessions = "*"                     # or ["ahp-session:/s1", ...]
//! token_sha256 = "<64 hex digits>"   # SHA-256 of the token; the token itself is never stored
//! [[trust_group]]
//! principals = ["alice", "bob"]
//! ```
//!
//! The file is validated as a whole on load: unknown keys, bad ids, duplicate ids or tokens and
//! inconsistent limits are refused with a message naming the file, rather than half-applied.
//! [`save`] writes atomically (temporary file, fsync, rename), so a crash never leaves a
//! truncated config that would lock every principal out. Saving rewrites the file from the
//! parsed values: comments are not kept.
//!
//! `busy_poll_us` and `coalesce_us` used to be top-level keys. They are still read there, with
//! one warning per load naming `[tuning]` (the same key in both places is refused), and
//! [`save`] writes them under `[tuning]`: a file written for an older build keeps working, and
//! `benches/ab.sh` can give an old and a new build the same settings.
//!
//! The file format (its text, and its shape as serde sees it) is in `format`; the rules every
//! value must meet, checked on load and before every save, are in `validate`.

mod format;
#[cfg(test)]
mod tests;
mod validate;

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::SocketAddr;
#[cfg(unix)]
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use axhost_core::{session_id_from_scope_entry, Limits, Role, SessionScope};

use crate::datadir::CONFIG_FILE;
use crate::server::DriverLimits;
use format::{parse, RawConfig};

/// Default keepalive interval: a dead peer is noticed within a minute, and a healthy idle
/// client sees one 2-byte ping every 30 s.
pub const KEEPALIVE_MS_DEFAULT: u64 = 30_000;

/// Default busy-polling budget. Spinning starts only while events arrive within it and the
/// driver is already busy at least 40% of the time (about 70k notifications a second at 1→1 on
/// the reference VM), so an idle or lightly loaded host never spins.
pub const BUSY_POLL_US_DEFAULT: u64 = 50;

/// Largest busy-polling budget accepted: past a millisecond, spinning wastes more than any
/// wake-up it saves.
pub const BUSY_POLL_US_MAX: u64 = 1_000;

/// Default read-coalescing gap. Coalescing starts only while the driver is saturated and its
/// turns read few frames (peers writing one frame per `send` as fast as they can); then a
/// message waits up to this much longer and the host relays ~3.5× as many
/// (`io/src/server/coalesce.rs`, `docs/performance.md`).
pub const COALESCE_US_DEFAULT: u64 = 20;

/// Default writer spin: after a commit, the writer thread polls its queue this long before
/// sleeping on it, but only while the previous change came within it (a single client
/// dispatching closed-loop; `io/src/writer.rs`, "Waiting"). Waking a sleeping writer cost
/// ~60-70 µs of the C = 1 echo on the reference VM (p50 ~330 → ~260 µs with it).
pub const WRITER_SPIN_US_DEFAULT: u64 = 200;

/// Largest writer spin accepted: a commit takes a few hundred µs, and a change that comes later
/// than a millisecond after one is not worth a core.
pub const WRITER_SPIN_US_MAX: u64 = 1_000;

/// Largest read-coalescing gap accepted: the gap is spun, and past a few hundred µs it costs
/// more latency than any batch it gathers is worth. While coalescing, the gap adapts between 65%
/// and 200% of the configured one (`server/coalesce.rs`).
pub const COALESCE_US_MAX: u64 = 200;

/// The repository a host serves when `axhost.toml` names none.
pub const REPOSITORY_DEFAULT: &str = "default";

/// Longest repository name accepted.
pub const REPOSITORY_LEN_MAX: usize = 128;

impl HostFileConfig {
    /// The busy-polling budget to run with, in microseconds (0 = off).
    pub fn busy_poll(&self) -> u64 {
        self.tuning.busy_poll_us.unwrap_or(BUSY_POLL_US_DEFAULT)
    }

    /// The read-coalescing gap to run with, in microseconds (0 = off).
    pub fn coalesce(&self) -> u64 {
        self.tuning.coalesce_us.unwrap_or(COALESCE_US_DEFAULT)
    }

    /// The writer thread's spin budget to run with, in microseconds (0 = off).
    pub fn writer_spin(&self) -> u64 {
        self.tuning.writer_spin_us.unwrap_or(WRITER_SPIN_US_DEFAULT)
    }

    /// The repository this host serves: the file's `repository`, else [`REPOSITORY_DEFAULT`].
    pub fn repository(&self) -> &str {
        self.repository.as_deref().unwrap_or(REPOSITORY_DEFAULT)
    }

    /// The keepalive interval to run with, `None` when probing is off.
    pub fn keepalive(&self) -> Option<u64> {
        match self.keepalive_ms {
            None => Some(KEEPALIVE_MS_DEFAULT),
            Some(0) => None,
            Some(ms) => Some(ms),
        }
    }
}

/// The parsed and validated contents of `axhost.toml`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostFileConfig {
    /// Address to listen on; `None` means the caller's default (`127.0.0.1:7331`).
    pub listen: Option<SocketAddr>,
    /// The repository this host serves (`initialize` advertises it, every AXP exchange names
    /// it); `None` uses [`REPOSITORY_DEFAULT`]. The store binds it to the database on first
    /// start and refuses another name later. Checked by [`valid_repository`].
    pub repository: Option<String>,
    /// Origins allowed to open a WebSocket; `None` allows any. A request without `Origin`
    /// (not from a browser) is always allowed.
    pub allowed_origins: Option<Vec<String>>,
    /// Keepalive interval: a WebSocket silent this long is pinged, one silent twice as long is
    /// closed. `None` uses [`KEEPALIVE_MS_DEFAULT`]; `Some(0)` turns probing off.
    pub keepalive_ms: Option<u64>,
    /// `[tuning]`: knobs that trade CPU for latency or throughput, never correctness.
    pub tuning: Tuning,
    /// Every bound of the core, defaults filled in for fields the file does not set.
    pub limits: Limits,
    /// The driver's own bounds, also set in `[limits]`, defaults filled in likewise.
    pub driver_limits: DriverLimits,
    /// Principals that may connect, in file order.
    pub principals: Vec<PrincipalEntry>,
    /// Groups of principal ids that trust each other (used by client services).
    pub trust_groups: Vec<Vec<String>>,
}

/// `[tuning]`: how the driver spends CPU to save latency or syscalls. Any value in range is
/// correct; they only move speed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Busy-polling budget in µs; `None` uses [`BUSY_POLL_US_DEFAULT`], `Some(0)` turns it off.
    pub busy_poll_us: Option<u64>,
    /// Read-coalescing gap in µs, where the adaptive gap starts; `None` uses
    /// [`COALESCE_US_DEFAULT`], `Some(0)` turns it off.
    pub coalesce_us: Option<u64>,
    /// Writer spin in µs; `None` uses [`WRITER_SPIN_US_DEFAULT`], `Some(0)` turns it off.
    pub writer_spin_us: Option<u64>,
}

/// One `[[principal]]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrincipalEntry {
    /// Stable principal id (`axhost_core::valid_id` grammar), unique in the file.
    pub id: String,
    /// What it may do.
    pub role: Role,
    /// Which sessions it may see.
    pub sessions: SessionScope,
    /// SHA-256 of its token.
    pub token_sha256: [u8; 32],
}

/// Why the configuration could not be read, written or changed. Every message names the file.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// Reading, writing or renaming a file failed.
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// The file is not valid TOML or does not have the expected shape.
    Parse {
        /// The config file.
        path: PathBuf,
        /// Line, column and problem.
        message: String,
    },
    /// The file parses but a value is not acceptable.
    Invalid {
        /// The config file.
        path: PathBuf,
        /// The problem, naming the entry.
        message: String,
    },
    /// `token add` with an id that already has a principal.
    PrincipalExists {
        /// The config file.
        path: PathBuf,
        /// The id asked for.
        id: String,
    },
    /// `token revoke` with an id that has no principal.
    UnknownPrincipal {
        /// The config file.
        path: PathBuf,
        /// The id asked for.
        id: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Io {
                path,
                action,
                source,
            } => {
                write!(f, "{}: {action}: {source}", path.display())
            }
            ConfigError::Parse { path, message } => write!(f, "{}: {message}", path.display()),
            ConfigError::Invalid { path, message } => write!(f, "{}: {message}", path.display()),
            ConfigError::PrincipalExists { path, id } => write!(
                f,
                "{}: principal {id:?} already exists (revoke it first to issue a new token)",
                path.display()
            ),
            ConfigError::UnknownPrincipal { path, id } => {
                write!(f, "{}: no principal {id:?}", path.display())
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Whether `name` is an acceptable repository name: 1 to [`REPOSITORY_LEN_MAX`] characters of
/// ASCII letters, digits and `.` `_` `/` `-`, starting with a letter or digit (so `acme/widgets`
/// and `widgets-2.0` are names, and a name never starts with a separator or holds spaces,
/// quotes or control characters that would garble a log line or an error message).
pub fn valid_repository(name: &str) -> bool {
    let mut bytes = name.bytes();
    let Some(first) = bytes.next() else {
        return false;
    };
    name.len() <= REPOSITORY_LEN_MAX
        && first.is_ascii_alphanumeric()
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'))
}

/// The path of the config file in `data_dir`.
pub fn config_path(data_dir: &Path) -> PathBuf {
    data_dir.join(CONFIG_FILE)
}

/// Reads and validates `data_dir/axhost.toml`. A missing file is an empty configuration with
/// default limits (the caller then bootstraps a maintainer).
pub fn load(data_dir: &Path) -> Result<HostFileConfig, ConfigError> {
    let path = config_path(data_dir);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HostFileConfig::default()),
        Err(source) => {
            return Err(ConfigError::Io {
                path,
                action: "reading",
                source,
            })
        }
    };
    parse(&text).map_err(|e| e.at(path))
}

/// Writes `config` to `data_dir/axhost.toml` atomically with mode 0600. The result loads back
/// as `config`; a configuration that would not load is refused instead of written.
pub fn save(data_dir: &Path, config: &HostFileConfig) -> Result<(), ConfigError> {
    let path = config_path(data_dir);
    let raw = RawConfig::from_config(config);
    // Check that what is written reads back as-is, so a bad value cannot lock the host out.
    let reloaded = raw
        .clone()
        .validate()
        .map_err(|message| ConfigError::Invalid {
            path: path.clone(),
            message: format!("refusing to save: {message}"),
        })?;
    if &reloaded != config {
        return Err(ConfigError::Invalid {
            path,
            message: "refusing to save: the configuration would not read back unchanged".into(),
        });
    }
    let body = toml::to_string(&raw).map_err(|e| ConfigError::Invalid {
        path: path.clone(),
        message: format!("cannot serialize: {e}"),
    })?;
    let text = format!("{HEADER}{body}");
    write_atomically(&path, text.as_bytes())
}

/// Opening lines of a saved file.
const HEADER: &str = "# axhost host configuration. `axhost token add|revoke` rewrite this file \
                      (comments are not kept).\n# token_sha256 is the SHA-256 of a token; \
                      tokens themselves are never stored.\n\n";

/// The scope as a person reads it: `*`, or the session URIs separated by commas.
pub fn scope_display(scope: &SessionScope) -> String {
    match scope {
        SessionScope::All => "*".to_owned(),
        SessionScope::Only(ids) if ids.is_empty() => "(none)".to_owned(),
        SessionScope::Only(ids) => ids
            .iter()
            .map(|id| format!("ahp-session:/{id}"))
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// Parses a scope as given on the command line (`--sessions`): `*`, or session URIs (or bare
/// ids) separated by commas. An empty string is an empty scope: the principal sees no session.
pub fn parse_sessions_arg(arg: &str) -> Result<SessionScope, String> {
    let arg = arg.trim();
    if arg == "*" {
        return Ok(SessionScope::All);
    }
    let mut ids = BTreeSet::new();
    for entry in arg.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let id = session_id_from_scope_entry(entry)
            .ok_or_else(|| format!("{entry:?} is not a session URI (ahp-session:/ID)"))?;
        ids.insert(id.to_owned());
    }
    Ok(SessionScope::Only(ids))
}

/// Writes `bytes` to `path` through a private temporary file in the same directory, then
/// renames it into place and syncs the directory, so readers see the old or the new file.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ConfigError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or(CONFIG_FILE.as_ref()));
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let io_err = |p: &Path, action: &'static str| {
        let p = p.to_owned();
        move |source| ConfigError::Io {
            path: p,
            action,
            source,
        }
    };
    let result = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        options.mode(0o600);
        let mut file = options.open(&tmp).map_err(io_err(&tmp, "creating"))?;
        // The mode above applies only to a new file; a stale temporary keeps its own.
        #[cfg(unix)]
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))
            .map_err(io_err(&tmp, "setting permissions"))?;
        file.write_all(bytes).map_err(io_err(&tmp, "writing"))?;
        file.sync_all().map_err(io_err(&tmp, "syncing"))?;
        drop(file);
        fs::rename(&tmp, path).map_err(io_err(path, "replacing"))?;
        // Makes the rename itself durable.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(dir, "syncing the directory"))
    })();
    if result.is_err() {
        // Best effort: a leftover temporary is harmless and overwritten next time.
        let _ = fs::remove_file(&tmp);
    }
    result
}
