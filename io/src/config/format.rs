//! The file format: the text as TOML, with parse errors that name a line, a column and a key but
//! never quote a value, and the file's shape as serde sees it.

use std::fmt;
use std::path::PathBuf;

use axhost_core::{Limits, SessionScope};
use serde::{Deserialize, Serialize};

use super::{ConfigError, HostFileConfig};
use crate::credentials::to_hex;
use crate::server::DriverLimits;

/// Parses the text of a config file (the path is added by the caller).
pub(super) fn parse(text: &str) -> Result<HostFileConfig, Problem> {
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

/// A parse or validation problem before the file path is known; [`load`](super::load) turns it
/// into a [`ConfigError`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Problem {
    /// Not TOML, or the wrong shape.
    Parse(String),
    /// A value is not acceptable.
    Invalid(String),
}

impl Problem {
    /// Attaches the file the problem was found in.
    pub(super) fn at(self, path: PathBuf) -> ConfigError {
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

// ---------------------------------------------------------------------------------------------
// The file's shape, as serde sees it. Visible only inside `config`, so the public types carry
// only valid values.

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) repository: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) allowed_origins: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) keepalive_ms: Option<u64>,
    /// Where `[tuning]`'s keys used to be; read (with a warning), never written.
    #[serde(default, skip_serializing)]
    pub(super) busy_poll_us: Option<u64>,
    #[serde(default, skip_serializing)]
    pub(super) coalesce_us: Option<u64>,
    #[serde(default, skip_serializing_if = "RawLimits::is_empty")]
    pub(super) limits: RawLimits,
    #[serde(default, skip_serializing_if = "RawTuning::is_empty")]
    pub(super) tuning: RawTuning,
    #[serde(default, rename = "principal", skip_serializing_if = "Vec::is_empty")]
    pub(super) principals: Vec<RawPrincipal>,
    #[serde(default, rename = "trust_group", skip_serializing_if = "Vec::is_empty")]
    pub(super) trust_groups: Vec<RawTrustGroup>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrincipal {
    pub(super) id: String,
    pub(super) role: String,
    /// `"*"` or an array of session URIs; checked by hand for a clearer message than serde's.
    pub(super) sessions: toml::Value,
    pub(super) token_sha256: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTrustGroup {
    pub(super) principals: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTuning {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) busy_poll_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) coalesce_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) writer_spin_us: Option<u64>,
}

impl RawTuning {
    fn is_empty(&self) -> bool {
        self.busy_poll_us.is_none() && self.coalesce_us.is_none() && self.writer_spin_us.is_none()
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
        pub(super) struct RawLimits {
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
            pub(super) fn to_limits(&self) -> Limits {
                let d = Limits::default();
                Limits { $($field: self.$field.unwrap_or(d.$field),)* }
            }

            pub(super) fn to_driver_limits(&self) -> DriverLimits {
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
            pub(super) fn bumped() -> (Limits, DriverLimits) {
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
    blob_bytes_max: u64,
    blob_storage_bytes_max: u64,
    executors_max: u32,
    grants_per_session_max: u32,
    in_flight_changes_max: u32,
    held_messages_max: u32,
    held_message_bytes_max: u64,
    memory_lessons_max: u32,
    memory_evidence_max: u32,
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
    pub(super) fn from_config(c: &HostFileConfig) -> RawConfig {
        RawConfig {
            listen: c.listen.map(|a| a.to_string()),
            repository: c.repository.clone(),
            allowed_origins: c.allowed_origins.clone(),
            keepalive_ms: c.keepalive_ms,
            busy_poll_us: None,
            coalesce_us: None,
            limits: RawLimits::from_limits(&c.limits, &c.driver_limits),
            tuning: RawTuning {
                busy_poll_us: c.tuning.busy_poll_us,
                coalesce_us: c.tuning.coalesce_us,
                writer_spin_us: c.tuning.writer_spin_us,
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
}
