//! Bounds the driver enforces beside the core's `Limits`: how many sockets may be unauthenticated,
//! what partially received messages may hold together, and the largest message a connection
//! may send, by its principal's role.
//!
//! The socket table has two budgets, so that sockets without a token can never crowd out
//! authenticated clients:
//! - *pre-authentication*: sockets still sending their HTTP head, and sockets that were answered
//!   over plain HTTP (`/healthz`, 4xx, 503) and linger until the peer closes. At most
//!   [`DriverLimits::pre_auth_sockets_max`]. When it is full, a new socket takes the place of the
//!   oldest answered one, else of the oldest head-sender the driver has already read once and
//!   found incomplete; only when every one is a head not yet read (a burst this very turn) does
//!   the newcomer wait in the listen backlog until the turn has read them.
//! - *authenticated*: open WebSockets, at most `Limits::connections_max` (an upgrade past it is
//!   answered 503, which makes it an answered pre-authentication socket), and WebSockets that
//!   closed and linger, at most `connections_max` more (past that the oldest is dropped).
//!
//! So the driver holds at most `pre_auth_sockets_max + 2 × connections_max` sockets.

use axhost_core::{Limits, Role};

/// Bounds the driver enforces itself. Set in `[limits]` of `axhost.toml` beside the core's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverLimits {
    /// Sockets that have not authenticated: sending their HTTP head, or answered over HTTP and
    /// lingering. Past it a new socket evicts one of them (module doc), never a WebSocket.
    pub pre_auth_sockets_max: u32,
    /// What partially received WebSocket messages may hold across every connection, in bytes:
    /// fragments assembled so far and a frame's bytes beyond the standard 16 KiB read buffer. A
    /// connection whose message would take the total past it is closed with 1013 (try again
    /// later); other connections are untouched.
    pub partial_message_bytes_total_max: u64,
}

/// See [`DriverLimits::pre_auth_sockets_max`]: the sockets a burst of reconnecting clients needs
/// for their heads, and what the old pending table held.
pub const DEFAULT_PRE_AUTH_SOCKETS_MAX: u32 = 1024;

/// See [`DriverLimits::partial_message_bytes_total_max`]: 128 MiB, a hundred client-service
/// messages of the largest size arriving at once, and what the host's RSS may grow by for them.
pub const DEFAULT_PARTIAL_MESSAGE_BYTES_TOTAL_MAX: u64 = 128 * 1024 * 1024;

impl Default for DriverLimits {
    fn default() -> Self {
        DriverLimits {
            pre_auth_sockets_max: DEFAULT_PRE_AUTH_SOCKETS_MAX,
            partial_message_bytes_total_max: DEFAULT_PARTIAL_MESSAGE_BYTES_TOTAL_MAX,
        }
    }
}

impl DriverLimits {
    /// Checks the values against each other and the core's `limits`.
    pub fn validate(&self, limits: &Limits) -> Result<(), String> {
        if self.pre_auth_sockets_max == 0 {
            return Err("pre_auth_sockets_max must be at least 1".into());
        }
        let largest = message_bytes_max_for_role(limits, Role::Maintainer) as u64;
        if self.partial_message_bytes_total_max < largest {
            return Err(format!(
                "partial_message_bytes_total_max must be at least {largest} (the largest message \
                 a connection may send), or no such message could ever arrive in pieces"
            ));
        }
        Ok(())
    }
}

/// The largest message a connection of `role` may send, in bytes; a frame or message announced
/// past it is closed with 1009 from its header, before its payload is read.
///
/// It is twice the largest message the core accepts for any method
/// (`Limits::message_bytes_max_for`: a client-service payload plus its envelope, by default
/// 1 MiB + 64 KiB), and never more than `frame_bytes_max`. Up to twice the core's limit a
/// message is still read so the core can answer it (`-32043` with the request's id, or a
/// relayed request failed at once), the way clients learn what they did wrong; past that it is
/// no mistake worth memory.
///
/// Uploads (`_axp/blobPut`, ~21.4 MB by default) are the one message only some roles may send:
/// maintainers, contributors and verifiers may upload and get that allowance here; observers
/// may not, and keep the largest non-upload message.
pub fn message_bytes_max_for_role(limits: &Limits, role: Role) -> usize {
    let frame_max = usize::try_from(limits.frame_bytes_max).unwrap_or(usize::MAX);
    let largest_non_upload = limits.message_bytes_max_for(None);
    let largest = match role {
        Role::Maintainer | Role::Contributor | Role::Verifier => {
            largest_non_upload.max(limits.message_bytes_max_for(Some("_axp/blobPut")))
        }
        Role::Observer => largest_non_upload,
    };
    largest.saturating_mul(2).min(frame_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(DriverLimits::default().validate(&Limits::default()), Ok(()));
    }

    #[test]
    fn uploaders_may_send_a_maximal_blob_and_observers_twice_the_largest_other_message() {
        let limits = Limits::default();
        let upload = limits.message_bytes_max_for(Some("_axp/blobPut"));
        for role in [Role::Maintainer, Role::Contributor, Role::Verifier] {
            let cap = message_bytes_max_for_role(&limits, role);
            assert!(cap >= upload, "{role} can upload a maximal blob");
            assert_eq!(cap, limits.frame_bytes_max as usize, "{role}");
        }
        assert_eq!(
            message_bytes_max_for_role(&limits, Role::Observer),
            2 * (1024 * 1024 + 64 * 1024)
        );
        let small = Limits {
            frame_bytes_max: 70_000,
            service_payload_bytes_max: 1024,
            blob_bytes_max: 1024,
            ..Limits::default()
        };
        assert_eq!(message_bytes_max_for_role(&small, Role::Observer), 70_000);
        assert_eq!(message_bytes_max_for_role(&small, Role::Verifier), 70_000);
    }

    #[test]
    fn a_total_that_cannot_hold_one_message_is_refused() {
        let limits = Limits::default();
        let bad = DriverLimits {
            partial_message_bytes_total_max: 1024,
            ..DriverLimits::default()
        };
        assert!(bad.validate(&limits).is_err());
        let none = DriverLimits {
            pre_auth_sockets_max: 0,
            ..DriverLimits::default()
        };
        assert!(none.validate(&limits).is_err());
    }
}
