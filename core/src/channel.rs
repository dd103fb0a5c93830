//! Channel URIs the host serves, and how to tell them apart.

/// The one root channel.
pub const ROOT: &str = "ahp-root://";

/// The client-services catalog channel (`x-` marks an implementation-defined scheme).
pub const CATALOG: &str = "x-client-services://";

/// The AXP executor registry channel.
pub const EXECUTORS: &str = "axp-executors://";

/// The AXP repository memory channel.
pub const MEMORY: &str = "axp-memory://";

/// Which channel a URI names. Session-scoped channels carry the session id.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ChannelRef<'a> {
    /// `ahp-root://`
    Root,
    /// `ahp-session:/ID`
    Session(&'a str),
    /// `ahp-chat:/ID` (each session has one default chat with the session's id)
    Chat(&'a str),
    /// `ahp-changeset:/ID`
    Changeset(&'a str),
    /// `axp-session:/ID`: the session's AXP exchange.
    Exchange(&'a str),
    /// `axp-executors://`: the AXP executor registry.
    Executors,
    /// `axp-memory://`: the AXP repository memory.
    Memory,
    /// `x-client-services://`: the client-services catalog (state differs per observer).
    Catalog,
    /// Anything else: not served.
    Unknown,
}

impl<'a> ChannelRef<'a> {
    /// Classifies `uri`. Session ids must be valid (see [`valid_session_id`]).
    pub fn parse(uri: &'a str) -> ChannelRef<'a> {
        if uri == ROOT {
            return ChannelRef::Root;
        }
        if uri == CATALOG {
            return ChannelRef::Catalog;
        }
        if uri == EXECUTORS {
            return ChannelRef::Executors;
        }
        if uri == MEMORY {
            return ChannelRef::Memory;
        }
        let scoped = [
            (
                "ahp-session:/",
                ChannelRef::Session as fn(&'a str) -> ChannelRef<'a>,
            ),
            ("ahp-chat:/", ChannelRef::Chat),
            ("ahp-changeset:/", ChannelRef::Changeset),
            ("axp-session:/", ChannelRef::Exchange),
        ];
        for (prefix, make) in scoped {
            if let Some(id) = uri.strip_prefix(prefix) {
                return if valid_session_id(id) {
                    make(id)
                } else {
                    ChannelRef::Unknown
                };
            }
        }
        ChannelRef::Unknown
    }

    /// The session this channel belongs to, if any.
    pub fn session_id(self) -> Option<&'a str> {
        match self {
            ChannelRef::Session(id)
            | ChannelRef::Chat(id)
            | ChannelRef::Changeset(id)
            | ChannelRef::Exchange(id) => Some(id),
            ChannelRef::Root
            | ChannelRef::Catalog
            | ChannelRef::Executors
            | ChannelRef::Memory
            | ChannelRef::Unknown => None,
        }
    }
}

/// Session ids as the AXP host accepts them: `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`.
pub fn valid_session_id(id: &str) -> bool {
    valid_id(id)
}

/// The AXP id grammar, also used for clientIds: `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`.
pub fn valid_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// `ahp-session:/ID`
pub fn session_uri(id: &str) -> String {
    format!("ahp-session:/{id}")
}

/// `ahp-chat:/ID`
pub fn chat_uri(id: &str) -> String {
    format!("ahp-chat:/{id}")
}

/// `axp-session:/ID`
pub fn exchange_uri(id: &str) -> String {
    format!("axp-session:/{id}")
}

/// `ahp-changeset:/ID`
pub fn changeset_uri(id: &str) -> String {
    format!("ahp-changeset:/{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_served_schemes() {
        assert_eq!(ChannelRef::parse("ahp-root://"), ChannelRef::Root);
        assert_eq!(
            ChannelRef::parse("ahp-session:/s1"),
            ChannelRef::Session("s1")
        );
        assert_eq!(ChannelRef::parse("ahp-chat:/s1"), ChannelRef::Chat("s1"));
        assert_eq!(
            ChannelRef::parse("ahp-changeset:/s-1.a_b"),
            ChannelRef::Changeset("s-1.a_b")
        );
        assert_eq!(ChannelRef::parse("ahp-session:/"), ChannelRef::Unknown);
        assert_eq!(ChannelRef::parse("ahp-session:/../x"), ChannelRef::Unknown);
        assert_eq!(ChannelRef::parse("ahp-session:/.x"), ChannelRef::Unknown);
        assert_eq!(ChannelRef::parse("x-other://"), ChannelRef::Unknown);
        assert_eq!(
            ChannelRef::parse("axp-session:/s1"),
            ChannelRef::Exchange("s1")
        );
        assert_eq!(ChannelRef::parse("axp-executors://"), ChannelRef::Executors);
        assert_eq!(ChannelRef::parse("axp-memory://"), ChannelRef::Memory);
        assert_eq!(ChannelRef::Memory.session_id(), None);
        assert_eq!(ChannelRef::parse("axp-session:/"), ChannelRef::Unknown);
    }

    #[test]
    fn ids_are_bounded() {
        assert!(valid_id(&"a".repeat(128)));
        assert!(!valid_id(&"a".repeat(129)));
        assert!(!valid_id("a b"));
        assert!(!valid_id("é"));
    }
}
