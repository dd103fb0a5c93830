//! Who is on the other end of a connection: established by transport credentials in the driver,
//! never by anything a client says in JSON-RPC.

use std::collections::BTreeSet;
use std::fmt;

/// What a principal may do. Roles come only from transport credentials.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Creates sessions and drives chats.
    Maintainer,
    /// Runs executors (AXP); may not drive chats.
    Contributor,
    /// Records verification results (AXP).
    Verifier,
    /// Reads only.
    Observer,
}

impl Role {
    /// The wire and config name of the role.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Maintainer => "maintainer",
            Role::Contributor => "contributor",
            Role::Verifier => "verifier",
            Role::Observer => "observer",
        }
    }

    /// Parses a config or wire name.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "maintainer" => Some(Role::Maintainer),
            "contributor" => Some(Role::Contributor),
            "verifier" => Some(Role::Verifier),
            "observer" => Some(Role::Observer),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which sessions a principal may see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionScope {
    /// Every session (`sessions = "*"`).
    All,
    /// Only these session ids (the `ID` of `ahp-session:/ID`).
    Only(BTreeSet<String>),
}

/// An authenticated identity with a role and a session scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Stable principal id from the host configuration.
    pub id: String,
    /// What it may do.
    pub role: Role,
    /// What it may see.
    pub sessions: SessionScope,
}

impl Principal {
    /// Whether this principal may read session `id` and its channels.
    pub fn can_read_session(&self, id: &str) -> bool {
        match &self.sessions {
            SessionScope::All => true,
            SessionScope::Only(ids) => ids.contains(id),
        }
    }

    /// A principal with every permission; for tests and the simulator.
    pub fn maintainer(id: &str) -> Principal {
        Principal {
            id: id.to_owned(),
            role: Role::Maintainer,
            sessions: SessionScope::All,
        }
    }
}

/// Parses a session scope entry as written in config: a bare id, `ahp-session:/ID` or
/// `axp-session:/ID`. Returns the id.
pub fn session_id_from_scope_entry(entry: &str) -> Option<&str> {
    let id = entry
        .strip_prefix("ahp-session:/")
        .or_else(|| entry.strip_prefix("axp-session:/"))
        .unwrap_or(entry);
    crate::channel::valid_session_id(id).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip() {
        for r in [
            Role::Maintainer,
            Role::Contributor,
            Role::Verifier,
            Role::Observer,
        ] {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        assert_eq!(Role::parse("admin"), None);
    }

    #[test]
    fn scope_entries_accept_both_uri_forms() {
        assert_eq!(session_id_from_scope_entry("ahp-session:/s1"), Some("s1"));
        assert_eq!(session_id_from_scope_entry("axp-session:/s1"), Some("s1"));
        assert_eq!(session_id_from_scope_entry("s1"), Some("s1"));
        assert_eq!(session_id_from_scope_entry("ahp-session:/"), None);
    }
}
