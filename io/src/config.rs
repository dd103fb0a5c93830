//! The host configuration file, `DIR/axhost.toml`: listen address, Origin allow-list, limits,
//! tuning, principals (with token digests) and trust groups.
//!
//! ```toml
//! listen = "127.0.0.1:7331"          # optional
//! allowed_origins = ["https://x"]    # optional; absent = any Origin
//! keepalive_ms = 30000               # optional; ping a silent WebSocket, close it after 2x; 0 = off
//! [limits]                           # optional; any field of axhost_core::Limits or of
//! subscriptions_per_conn_max = 256   #   axhost_io::server::DriverLimits
//! pre_auth_sockets_max = 1024
//! [tuning]                           # optional; speed, never correctness
//! busy_poll_us = 50                  # poll this long before sleeping under load; 0 = off
//! coalesce_us = 20                   # starting gap before each turn while saturated by unbatched peers; 0 = off
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::SocketAddr;
#[cfg(unix)]
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use axhost_core::{session_id_from_scope_entry, valid_id, Limits, Role, SessionScope};
use serde::{Deserialize, Serialize};

use crate::credentials::{digest_from_hex, to_hex};
use crate::datadir::CONFIG_FILE;
use crate::server::DriverLimits;

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

/// Largest read-coalescing gap accepted: the gap is spun, and past a few hundred µs it costs
/// more latency than any batch it gathers is worth. While coalescing, the gap adapts between 65%
/// and 200% of the configured one (`server/coalesce.rs`).
pub const COALESCE_US_MAX: u64 = 200;

impl HostFileConfig {
    /// The busy-polling budget to run with, in microseconds (0 = off).
    pub fn busy_poll(&self) -> u64 {
        self.tuning.busy_poll_us.unwrap_or(BUSY_POLL_US_DEFAULT)
    }

    /// The read-coalescing gap to run with, in microseconds (0 = off).
    pub fn coalesce(&self) -> u64 {
        self.tuning.coalesce_us.unwrap_or(COALESCE_US_DEFAULT)
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

/// Parses the text of a config file (the path is added by the caller).
fn parse(text: &str) -> Result<HostFileConfig, Problem> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| {
        // The error's own Display quotes the offending line, which could hold a secret someone
        // pasted by mistake (`token = "..."`); report the position and the message only.
        let message = match e.span() {
            Some(span) => {
                let (line, column) = line_column(text, span.start);
                let at = key_on_line(text, span.start)
                    .map(|k| format!(" (at {k})"))
                    .unwrap_or_default();
                format!(
                    "line {line}, column {column}{at}: {}",
                    e.message().trim_end()
                )
            }
            None => e.message().trim_end().to_owned(),
        };
        Problem::Parse(message)
    })?;
    raw.validate().map_err(Problem::Invalid)
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

/// A parse or validation problem before the file path is known; [`load`] turns it into a
/// [`ConfigError`].
#[derive(Clone, Debug, PartialEq, Eq)]
enum Problem {
    /// Not TOML, or the wrong shape.
    Parse(String),
    /// A value is not acceptable.
    Invalid(String),
}

impl Problem {
    /// Attaches the file the problem was found in.
    fn at(self, path: PathBuf) -> ConfigError {
        match self {
            Problem::Parse(message) => ConfigError::Parse { path, message },
            Problem::Invalid(message) => ConfigError::Invalid { path, message },
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Parse(m) | Problem::Invalid(m) => f.write_str(m),
        }
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The key (or table header) on the line holding byte `offset`, without its value: keys name
/// the problem for the reader, values may be secrets.
fn key_on_line(text: &str, offset: usize) -> Option<&str> {
    let start = text.get(..offset)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(start..)?.lines().next()?.trim();
    if line.starts_with('[') {
        return line
            .split_once(']')
            .map(|(h, _)| h.trim_start_matches('[').trim());
    }
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.contains('"') && !key.contains('\'')).then_some(key)
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

// ---------------------------------------------------------------------------------------------
// The file's shape, as serde sees it. Kept private so the public types carry only valid values.

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allowed_origins: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keepalive_ms: Option<u64>,
    /// Where `[tuning]`'s keys used to be; read (with a warning), never written.
    #[serde(default, skip_serializing)]
    busy_poll_us: Option<u64>,
    #[serde(default, skip_serializing)]
    coalesce_us: Option<u64>,
    #[serde(default, skip_serializing_if = "RawLimits::is_empty")]
    limits: RawLimits,
    #[serde(default, skip_serializing_if = "RawTuning::is_empty")]
    tuning: RawTuning,
    #[serde(default, rename = "principal", skip_serializing_if = "Vec::is_empty")]
    principals: Vec<RawPrincipal>,
    #[serde(default, rename = "trust_group", skip_serializing_if = "Vec::is_empty")]
    trust_groups: Vec<RawTrustGroup>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawPrincipal {
    id: String,
    role: String,
    /// `"*"` or an array of session URIs; checked by hand for a clearer message than serde's.
    sessions: toml::Value,
    token_sha256: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawTrustGroup {
    principals: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawTuning {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    busy_poll_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    coalesce_us: Option<u64>,
}

impl RawTuning {
    fn is_empty(&self) -> bool {
        self.busy_poll_us.is_none() && self.coalesce_us.is_none()
    }
}

/// Declares `RawLimits`, the `[limits]` table: every field of [`Limits`] and of
/// [`DriverLimits`], all optional.
///
/// The field lists are written once, here. Both conversions name every field without `..`, so
/// a field added to either struct fails to compile until it is added to this list (and so to
/// the file format) instead of being silently unconfigurable.
macro_rules! raw_limits {
    (
        core { $($field:ident: $ty:ty),* $(,)? }
        driver { $($dfield:ident: $dty:ty),* $(,)? }
    ) => {
        /// `[limits]` as written. Saving writes only values that differ from the defaults, so a
        /// later release's better default still reaches a file nobody tuned.
        #[derive(Clone, Debug, Default, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        struct RawLimits {
            $(
                #[serde(default, skip_serializing_if = "Option::is_none")]
                $field: Option<$ty>,
            )*
            $(
                #[serde(default, skip_serializing_if = "Option::is_none")]
                $dfield: Option<$dty>,
            )*
        }

        impl RawLimits {
            fn to_limits(&self) -> Limits {
                let d = Limits::default();
                Limits { $($field: self.$field.unwrap_or(d.$field),)* }
            }

            fn to_driver_limits(&self) -> DriverLimits {
                let d = DriverLimits::default();
                DriverLimits { $($dfield: self.$dfield.unwrap_or(d.$dfield),)* }
            }

            fn from_limits(limits: &Limits, driver: &DriverLimits) -> RawLimits {
                let Limits { $($field,)* } = limits.clone();
                let DriverLimits { $($dfield,)* } = driver.clone();
                let d = Limits::default();
                let dd = DriverLimits::default();
                RawLimits {
                    $($field: ($field != d.$field).then_some($field),)*
                    $($dfield: ($dfield != dd.$dfield).then_some($dfield),)*
                }
            }

            /// Every limit one above its default; for round-trip tests.
            #[cfg(test)]
            fn bumped() -> (Limits, DriverLimits) {
                let d = Limits::default();
                let dd = DriverLimits::default();
                (
                    Limits { $($field: d.$field + 1,)* },
                    DriverLimits { $($dfield: dd.$dfield + 1,)* },
                )
            }
        }
    };
}

raw_limits! {
    core {
    connections_max: u32,
    subscriptions_per_conn_max: u32,
    message_bytes_max: u32,
    frame_bytes_max: u32,
    handshake_timeout_ms: u64,
    queue_bytes_hard: u64,
    replay_events_max: u32,
    protocol_versions_max: u32,
    pending_messages_max: u32,
    queue_bytes_soft: u64,
    service_metadata_bytes_max: u32,
    service_method_bytes_max: u32,
    service_payload_bytes_max: u32,
    service_error_data_bytes_max: u32,
    services_per_conn_max: u32,
    relays_per_conn_max: u32,
    relays_per_service_max: u32,
    relay_timeout_ms: u64,
    relay_timeout_ms_max: u64,
    idle_client_ids_per_principal: u32,
    sessions_max: u32,
    chat_bytes_max: u64,
    chat_bytes_total_max: u64,
    }
    driver {
        pre_auth_sockets_max: u32,
        partial_message_bytes_total_max: u64,
    }
}

impl RawLimits {
    fn is_empty(&self) -> bool {
        self.to_limits() == Limits::default() && self.to_driver_limits() == DriverLimits::default()
    }
}

impl RawConfig {
    fn from_config(c: &HostFileConfig) -> RawConfig {
        RawConfig {
            listen: c.listen.map(|a| a.to_string()),
            allowed_origins: c.allowed_origins.clone(),
            keepalive_ms: c.keepalive_ms,
            busy_poll_us: None,
            coalesce_us: None,
            limits: RawLimits::from_limits(&c.limits, &c.driver_limits),
            tuning: RawTuning {
                busy_poll_us: c.tuning.busy_poll_us,
                coalesce_us: c.tuning.coalesce_us,
            },
            principals: c
                .principals
                .iter()
                .map(|p| RawPrincipal {
                    id: p.id.clone(),
                    role: p.role.as_str().to_owned(),
                    sessions: match &p.sessions {
                        SessionScope::All => toml::Value::String("*".into()),
                        SessionScope::Only(ids) => toml::Value::Array(
                            ids.iter()
                                .map(|id| toml::Value::String(format!("ahp-session:/{id}")))
                                .collect(),
                        ),
                    },
                    token_sha256: to_hex(&p.token_sha256),
                })
                .collect(),
            trust_groups: c
                .trust_groups
                .iter()
                .map(|g| RawTrustGroup {
                    principals: g.clone(),
                })
                .collect(),
        }
    }

    /// Checks every value and builds the public form. Messages name the entry, never a digest.
    fn validate(self) -> Result<HostFileConfig, String> {
        let listen = match &self.listen {
            None => None,
            Some(s) => Some(s.parse::<SocketAddr>().map_err(|_| {
                format!("listen = {s:?} is not an IP:PORT address (for example \"127.0.0.1:7331\")")
            })?),
        };
        if let Some(origins) = &self.allowed_origins {
            for o in origins {
                if o.is_empty() || o.chars().any(char::is_whitespace) {
                    return Err(format!("allowed_origins entry {o:?} is not an origin"));
                }
                if o.ends_with('/') {
                    return Err(format!(
                        "allowed_origins entry {o:?} ends with '/'; browsers send origins without \
                         a path, e.g. \"https://example.com\""
                    ));
                }
            }
        }
        let tuning = self.tuning()?;
        if let Some(us) = tuning.busy_poll_us.filter(|&us| us > BUSY_POLL_US_MAX) {
            return Err(format!(
                "busy_poll_us = {us} is over {BUSY_POLL_US_MAX} (1 ms); use 0 to turn it off"
            ));
        }
        if let Some(us) = tuning.coalesce_us.filter(|&us| us > COALESCE_US_MAX) {
            return Err(format!(
                "coalesce_us = {us} is over {COALESCE_US_MAX}; use 0 to turn it off"
            ));
        }
        let limits = self.limits.to_limits();
        limits.validate().map_err(|e| format!("[limits]: {e}"))?;
        let driver_limits = self.limits.to_driver_limits();
        driver_limits
            .validate(&limits)
            .map_err(|e| format!("[limits]: {e}"))?;

        let mut principals = Vec::with_capacity(self.principals.len());
        // Digest -> id, to refuse two principals sharing one token (authentication would be
        // ambiguous).
        let mut digests: BTreeMap<[u8; 32], String> = BTreeMap::new();
        let mut ids = BTreeSet::new();
        for (n, p) in self.principals.into_iter().enumerate() {
            if !valid_id(&p.id) {
                return Err(format!(
                    "principal #{}: id {:?} must be 1-128 characters of A-Z a-z 0-9 . _ - \
                     starting with a letter or digit",
                    n + 1,
                    p.id
                ));
            }
            if !ids.insert(p.id.clone()) {
                return Err(format!("principal {:?} is defined twice", p.id));
            }
            let role = Role::parse(&p.role).ok_or_else(|| {
                format!(
                    "principal {:?}: role {:?} is not one of maintainer, contributor, verifier, \
                     observer",
                    p.id, p.role
                )
            })?;
            let sessions = parse_scope(&p.id, &p.sessions)?;
            let token_sha256 = digest_from_hex(&p.token_sha256).ok_or_else(|| {
                format!(
                    "principal {:?}: token_sha256 must be 64 hex digits (the SHA-256 of the \
                     token, never the token itself)",
                    p.id
                )
            })?;
            if let Some(other) = digests.insert(token_sha256, p.id.clone()) {
                return Err(format!(
                    "principals {other:?} and {:?} have the same token",
                    p.id
                ));
            }
            principals.push(PrincipalEntry {
                id: p.id,
                role,
                sessions,
                token_sha256,
            });
        }

        let mut trust_groups = Vec::with_capacity(self.trust_groups.len());
        for (n, g) in self.trust_groups.into_iter().enumerate() {
            if g.principals.is_empty() {
                return Err(format!("trust_group #{} has no principals", n + 1));
            }
            let mut seen = BTreeSet::new();
            for id in &g.principals {
                if !ids.contains(id) {
                    return Err(format!(
                        "trust_group #{} names {id:?}, which is not a configured principal",
                        n + 1
                    ));
                }
                if !seen.insert(id) {
                    return Err(format!("trust_group #{} names {id:?} twice", n + 1));
                }
            }
            trust_groups.push(g.principals);
        }

        Ok(HostFileConfig {
            listen,
            allowed_origins: self.allowed_origins,
            keepalive_ms: self.keepalive_ms,
            tuning,
            limits,
            driver_limits,
            principals,
            trust_groups,
        })
    }
}

impl RawConfig {
    /// The top-level keys that belong under `[tuning]` now, as written in this file.
    fn misplaced_tuning_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.busy_poll_us.is_some() {
            keys.push("busy_poll_us");
        }
        if self.coalesce_us.is_some() {
            keys.push("coalesce_us");
        }
        keys
    }

    /// `[tuning]`, with the values of top-level keys written for an older build moved in (and
    /// a warning that names them); the same key in both places is refused.
    fn tuning(&self) -> Result<Tuning, String> {
        let both = |key: &str| {
            format!(
                "{key} is set both at the top level and under [tuning]; keep the one under                  [tuning]"
            )
        };
        if self.busy_poll_us.is_some() && self.tuning.busy_poll_us.is_some() {
            return Err(both("busy_poll_us"));
        }
        if self.coalesce_us.is_some() && self.tuning.coalesce_us.is_some() {
            return Err(both("coalesce_us"));
        }
        let misplaced = self.misplaced_tuning_keys();
        if !misplaced.is_empty() {
            tracing::warn!(
                keys = ?misplaced,
                "axhost.toml: these keys belong under [tuning] now; read from the top level                  for this start (`axhost token add` or `revoke` rewrites the file with them                  moved)"
            );
        }
        Ok(Tuning {
            busy_poll_us: self.tuning.busy_poll_us.or(self.busy_poll_us),
            coalesce_us: self.tuning.coalesce_us.or(self.coalesce_us),
        })
    }
}

/// `"*"` or an array of scope entries (bare id, `ahp-session:/ID` or `axp-session:/ID`).
fn parse_scope(id: &str, value: &toml::Value) -> Result<SessionScope, String> {
    let shape = || format!("principal {id:?}: sessions must be \"*\" or a list of session URIs");
    match value {
        toml::Value::String(s) if s == "*" => Ok(SessionScope::All),
        toml::Value::Array(items) => {
            let mut set = BTreeSet::new();
            for item in items {
                let entry = item.as_str().ok_or_else(shape)?;
                let session = session_id_from_scope_entry(entry).ok_or_else(|| {
                    format!("principal {id:?}: {entry:?} is not a session URI (ahp-session:/ID)")
                })?;
                set.insert(session.to_owned());
            }
            Ok(SessionScope::Only(set))
        }
        _ => Err(shape()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::digest;

    const DIGEST_A: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    fn full_text() -> String {
        format!(
            r#"
listen = "0.0.0.0:9000"
allowed_origins = ["https://x.example", "http://localhost:3000"]

[limits]
subscriptions_per_conn_max = 16
handshake_timeout_ms = 2500

[[principal]]
id = "alice"
role = "maintainer"
sessions = "*"
token_sha256 = "{DIGEST_A}"

[[principal]]
id = "bob"
role = "observer"
sessions = ["ahp-session:/s1", "axp-session:/s2", "s3"]
token_sha256 = "{}"

[[trust_group]]
principals = ["alice", "bob"]
"#,
            to_hex(&digest("bob-token"))
        )
    }

    fn err_of(text: &str) -> String {
        parse(text).expect_err("must be refused").to_string()
    }

    #[test]
    fn a_full_file_parses() {
        let c = parse(&full_text()).expect("valid");
        assert_eq!(c.listen, Some("0.0.0.0:9000".parse().expect("addr")));
        assert_eq!(
            c.allowed_origins,
            Some(vec![
                "https://x.example".to_owned(),
                "http://localhost:3000".to_owned()
            ])
        );
        assert_eq!(c.limits.subscriptions_per_conn_max, 16);
        assert_eq!(c.limits.handshake_timeout_ms, 2500);
        assert_eq!(c.limits.connections_max, Limits::default().connections_max);
        assert_eq!(c.principals.len(), 2);
        assert_eq!(c.principals[0].id, "alice");
        assert_eq!(c.principals[0].role, Role::Maintainer);
        assert_eq!(c.principals[0].sessions, SessionScope::All);
        assert_eq!(c.principals[0].token_sha256, digest("abc"));
        assert_eq!(c.principals[1].role, Role::Observer);
        let want: BTreeSet<String> = ["s1", "s2", "s3"].iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(c.principals[1].sessions, SessionScope::Only(want));
        assert_eq!(
            c.trust_groups,
            vec![vec!["alice".to_owned(), "bob".to_owned()]]
        );
    }

    #[test]
    fn an_empty_file_is_the_default() {
        assert_eq!(parse("").expect("empty"), HostFileConfig::default());
    }

    #[test]
    fn a_missing_file_is_the_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load(dir.path()).expect("load"), HostFileConfig::default());
    }

    #[test]
    fn save_and_load_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = parse(&full_text()).expect("valid");
        save(dir.path(), &c).expect("save");
        assert_eq!(load(dir.path()).expect("load"), c);
        let text = fs::read_to_string(config_path(dir.path())).expect("read");
        // Only non-default limits are written.
        assert!(text.contains("subscriptions_per_conn_max = 16"), "{text}");
        assert!(!text.contains("connections_max"), "{text}");
        // Scopes are written as URIs.
        assert!(text.contains("ahp-session:/s2"), "{text}");
        // Saving again over an existing file works and leaves no temporary behind.
        save(dir.path(), &HostFileConfig::default()).expect("save default");
        assert_eq!(load(dir.path()).expect("load"), HostFileConfig::default());
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("readdir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(CONFIG_FILE)]);
    }

    #[cfg(unix)]
    #[test]
    fn saved_file_is_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        save(dir.path(), &parse(&full_text()).expect("valid")).expect("save");
        let mode = fs::metadata(config_path(dir.path()))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn save_refuses_what_would_not_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = parse(&full_text()).expect("valid");
        c.principals[1].id = "alice".into();
        let e = save(dir.path(), &c).expect_err("duplicate id");
        assert!(e.to_string().contains("defined twice"), "{e}");
        let mut c = parse(&full_text()).expect("valid");
        c.limits.message_bytes_max = 1;
        assert!(save(dir.path(), &c).is_err());
        assert!(!config_path(dir.path()).exists());
    }

    #[test]
    fn unknown_keys_are_refused_with_their_position() {
        let e = err_of("listen = \"127.0.0.1:1\"\nlisten_port = 3\n");
        assert!(e.contains("line 2") && e.contains("listen_port"), "{e}");
        let e = err_of("[limits]\nconnections = 3\n");
        assert!(e.contains("connections"), "{e}");
        let text = format!(
            "[[principal]]\nid = \"a\"\nrole = \"observer\"\nsessions = \"*\"\n\
             token_sha256 = \"{DIGEST_A}\"\ntoken = \"supersecret-token-value-123\"\n"
        );
        let e = err_of(&text);
        assert!(e.contains("token"), "{e}");
        assert!(
            !e.contains("supersecret"),
            "the offending line must not be echoed: {e}"
        );
    }

    #[test]
    fn bad_values_are_refused() {
        let principal = |id: &str, role: &str, sessions: &str, digest: &str| {
            format!(
                "[[principal]]\nid = \"{id}\"\nrole = \"{role}\"\nsessions = {sessions}\n\
                 token_sha256 = \"{digest}\"\n"
            )
        };
        let e = err_of(&principal("a b", "observer", "\"*\"", DIGEST_A));
        assert!(e.contains("principal #1"), "{e}");
        let e = err_of(&principal("a", "admin", "\"*\"", DIGEST_A));
        assert!(e.contains("role \"admin\""), "{e}");
        let e = err_of(&principal("a", "observer", "\"all\"", DIGEST_A));
        assert!(e.contains("sessions must be"), "{e}");
        let e = err_of(&principal("a", "observer", "[\"ahp-chat:/x\"]", DIGEST_A));
        assert!(e.contains("not a session URI"), "{e}");
        let e = err_of(&principal("a", "observer", "[1]", DIGEST_A));
        assert!(e.contains("sessions must be"), "{e}");
        let e = err_of(&principal("a", "observer", "\"*\"", "abc"));
        assert!(e.contains("64 hex digits"), "{e}");
        let two = principal("a", "observer", "\"*\"", DIGEST_A)
            + &principal("a", "observer", "\"*\"", &to_hex(&digest("other")));
        assert!(err_of(&two).contains("defined twice"));
        let same = principal("a", "observer", "\"*\"", DIGEST_A)
            + &principal("b", "observer", "\"*\"", DIGEST_A);
        assert!(err_of(&same).contains("same token"));
        assert!(err_of("listen = \"localhost:80\"").contains("IP:PORT"));
        assert!(err_of("allowed_origins = [\"https://x/\"]").contains("ends with '/'"));
        assert!(err_of("[limits]\nmessage_bytes_max = 10\n").contains("[limits]"));
        assert!(err_of("[limits]\nconnections_max = -1\n").contains("connections_max"));
        let group = principal("a", "observer", "\"*\"", DIGEST_A)
            + "[[trust_group]]\nprincipals = [\"a\", \"zed\"]\n";
        assert!(err_of(&group).contains("\"zed\""));
        assert!(err_of("[[trust_group]]\nprincipals = []\n").contains("no principals"));
        assert!(err_of("not toml at all").contains("line 1"));
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(config_path(dir.path()), "bogus = 1\n").expect("write");
        let e = load(dir.path()).expect_err("invalid");
        assert!(matches!(e, ConfigError::Parse { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with(&config_path(dir.path()).display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn every_limit_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (limits, driver_limits) = RawLimits::bumped();
        assert_eq!(limits.validate(), Ok(()));
        assert_eq!(driver_limits.validate(&limits), Ok(()));
        let c = HostFileConfig {
            limits,
            driver_limits,
            ..HostFileConfig::default()
        };
        save(dir.path(), &c).expect("save");
        assert_eq!(load(dir.path()).expect("load"), c);
    }

    #[test]
    fn sessions_arguments_parse() {
        assert_eq!(parse_sessions_arg("*"), Ok(SessionScope::All));
        let ids: BTreeSet<String> = ["s1", "s2"].iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(
            parse_sessions_arg("ahp-session:/s1, axp-session:/s2,s1"),
            Ok(SessionScope::Only(ids))
        );
        assert_eq!(
            parse_sessions_arg(""),
            Ok(SessionScope::Only(BTreeSet::new()))
        );
        assert!(parse_sessions_arg("ahp-chat:/x").is_err());
    }

    #[test]
    fn scopes_display_as_uris() {
        assert_eq!(scope_display(&SessionScope::All), "*");
        assert_eq!(
            scope_display(&SessionScope::Only(BTreeSet::new())),
            "(none)"
        );
        let ids: BTreeSet<String> = ["a", "b"].iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(
            scope_display(&SessionScope::Only(ids)),
            "ahp-session:/a,ahp-session:/b"
        );
    }

    #[test]
    fn busy_poll_defaults_to_50_us_is_bounded_and_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(HostFileConfig::default().busy_poll(), BUSY_POLL_US_DEFAULT);
        fs::write(dir.path().join(CONFIG_FILE), "[tuning]\nbusy_poll_us = 0\n").expect("write");
        let c = load(dir.path()).expect("load");
        assert_eq!(c.busy_poll(), 0, "0 turns it off");
        save(dir.path(), &c).expect("save");
        assert_eq!(
            load(dir.path()).expect("reload").tuning.busy_poll_us,
            Some(0)
        );
        fs::write(
            dir.path().join(CONFIG_FILE),
            "[tuning]\nbusy_poll_us = 1001\n",
        )
        .expect("write");
        let e = load(dir.path()).expect_err("over the bound").to_string();
        assert!(e.contains("busy_poll_us = 1001"), "{e}");
    }

    #[test]
    fn coalesce_defaults_to_20_us_is_bounded_and_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(HostFileConfig::default().coalesce(), COALESCE_US_DEFAULT);
        fs::write(dir.path().join(CONFIG_FILE), "[tuning]\ncoalesce_us = 0\n").expect("write");
        let c = load(dir.path()).expect("load");
        assert_eq!(c.coalesce(), 0, "0 turns it off");
        save(dir.path(), &c).expect("save");
        assert_eq!(
            load(dir.path()).expect("reload").tuning.coalesce_us,
            Some(0)
        );
        fs::write(
            dir.path().join(CONFIG_FILE),
            "[tuning]\ncoalesce_us = 201\n",
        )
        .expect("write");
        let e = load(dir.path()).expect_err("over the bound").to_string();
        assert!(e.contains("coalesce_us = 201"), "{e}");
    }

    #[test]
    fn tuning_keys_at_the_top_level_are_still_read_and_saved_under_tuning() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = "busy_poll_us = 0\ncoalesce_us = 30\n";
        let raw: RawConfig = toml::from_str(old).expect("toml");
        assert_eq!(raw.misplaced_tuning_keys(), ["busy_poll_us", "coalesce_us"]);
        fs::write(dir.path().join(CONFIG_FILE), old).expect("write");
        let c = load(dir.path()).expect("an older build's file still loads");
        assert_eq!((c.busy_poll(), c.coalesce()), (0, 30));
        save(dir.path(), &c).expect("save");
        let text = fs::read_to_string(config_path(dir.path())).expect("read");
        let tuning = text.find("[tuning]").expect("saved under [tuning]");
        assert!(
            text.find("busy_poll_us").is_some_and(|at| at > tuning),
            "{text}"
        );
        assert!(
            text.find("coalesce_us").is_some_and(|at| at > tuning),
            "{text}"
        );
        let raw: RawConfig = toml::from_str(&text).expect("toml");
        assert!(raw.misplaced_tuning_keys().is_empty(), "{text}");
        assert_eq!(load(dir.path()).expect("reload"), c);
        // The old place is checked like the new one, and both at once is ambiguous.
        let e = err_of("coalesce_us = 201\n");
        assert!(e.contains("coalesce_us = 201"), "{e}");
        let e = err_of("busy_poll_us = 10\n[tuning]\nbusy_poll_us = 20\n");
        assert!(e.contains("both") && e.contains("busy_poll_us"), "{e}");
        let e = err_of("[tuning]\nspin_us = 3\n");
        assert!(e.contains("spin_us"), "{e}");
    }

    #[test]
    fn driver_limits_live_in_limits_and_are_checked() {
        let c = parse(
            "[limits]\npre_auth_sockets_max = 8\npartial_message_bytes_total_max = 4194304\n",
        )
        .expect("valid");
        assert_eq!(c.driver_limits.pre_auth_sockets_max, 8);
        assert_eq!(c.driver_limits.partial_message_bytes_total_max, 4 << 20);
        assert_eq!(c.limits, Limits::default());
        assert_eq!(
            parse("").expect("empty").driver_limits,
            DriverLimits::default()
        );
        let e = err_of("[limits]\npre_auth_sockets_max = 0\n");
        assert!(
            e.contains("[limits]") && e.contains("pre_auth_sockets_max"),
            "{e}"
        );
        let e = err_of("[limits]\npartial_message_bytes_total_max = 1000\n");
        assert!(e.contains("partial_message_bytes_total_max"), "{e}");
    }

    #[test]
    fn keepalive_defaults_to_30_s_and_zero_turns_it_off() {
        let mut c = HostFileConfig::default();
        assert_eq!(c.keepalive(), Some(KEEPALIVE_MS_DEFAULT));
        c.keepalive_ms = Some(0);
        assert_eq!(c.keepalive(), None);
        c.keepalive_ms = Some(250);
        assert_eq!(c.keepalive(), Some(250));
    }
}
