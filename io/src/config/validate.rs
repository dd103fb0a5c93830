//! The rules a configuration must meet. The file is checked as a whole, and every message
//! names the entry (never a digest): valid ids, no duplicate ids or tokens, trust groups of
//! configured principals, tuning within its bounds and in one place, consistent limits.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use axhost_core::{session_id_from_scope_entry, valid_id, Role, SessionScope};

use super::format::RawConfig;
use super::{
    valid_repository, HostFileConfig, PrincipalEntry, Tuning, BUSY_POLL_US_MAX, COALESCE_US_MAX,
    REPOSITORY_LEN_MAX, WRITER_SPIN_US_MAX,
};
use crate::credentials::digest_from_hex;

impl RawConfig {
    /// Checks every value and builds the public form. Messages name the entry, never a digest.
    pub(super) fn validate(self) -> Result<HostFileConfig, String> {
        let listen = match &self.listen {
            None => None,
            Some(s) => Some(s.parse::<SocketAddr>().map_err(|_| {
                format!("listen = {s:?} is not an IP:PORT address (for example \"127.0.0.1:7331\")")
            })?),
        };
        if let Some(name) = &self.repository {
            if !valid_repository(name) {
                return Err(format!(
                    "repository = {name:?} must be 1-{REPOSITORY_LEN_MAX} characters of A-Z a-z \
                     0-9 . _ / - starting with a letter or digit (for example \"acme/widgets\")"
                ));
            }
        }
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
        if let Some(us) = tuning.writer_spin_us.filter(|&us| us > WRITER_SPIN_US_MAX) {
            return Err(format!(
                "writer_spin_us = {us} is over {WRITER_SPIN_US_MAX} (1 ms); use 0 to turn it off"
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
            repository: self.repository,
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
    pub(super) fn misplaced_tuning_keys(&self) -> Vec<&'static str> {
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
                "{key} is set both at the top level and under [tuning]; keep the one under \
                 [tuning]"
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
                "axhost.toml: these keys belong under [tuning] now; read from the top level \
                 for this start (`axhost token add` or `revoke` rewrites the file with them \
                 moved)"
            );
        }
        Ok(Tuning {
            busy_poll_us: self.tuning.busy_poll_us.or(self.busy_poll_us),
            coalesce_us: self.tuning.coalesce_us.or(self.coalesce_us),
            writer_spin_us: self.tuning.writer_spin_us,
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
