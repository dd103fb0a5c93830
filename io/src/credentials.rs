//! Transport credentials: bearer tokens checked against SHA-256 digests from the config.
//!
//! Only digests are ever stored, so a leaked config file or backup does not leak a token. The
//! digest of a presented token is compared with *every* configured digest in constant time, so
//! response timing reveals neither which principal nearly matched nor how many bytes did.
//! Tokens are never logged; neither are digests.

use std::fmt;
use std::sync::Arc;

use axhost_core::Principal;
use rand::{RngCore, TryRngCore};
use sha2::{Digest, Sha256};

use crate::config::PrincipalEntry;

/// Shortest token that can authenticate. Matches the AXP host: anything shorter is too easy
/// to guess to be a credential, whatever the config says.
pub const TOKEN_CHARS_MIN: usize = 24;

/// Prefix of generated tokens, so a leaked one is recognisable in a secret scanner.
pub const TOKEN_PREFIX: &str = "axh_";

/// Random bytes in a generated token: 256 bits, far beyond guessing.
const TOKEN_RANDOM_BYTES: usize = 32;

/// The principals a host accepts, each behind the digest of its token.
#[derive(Clone)]
pub struct Credentials {
    entries: Vec<([u8; 32], Arc<Principal>)>,
}

impl fmt::Debug for Credentials {
    /// Shows how many principals there are, never their digests.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("principals", &self.entries.len())
            .finish()
    }
}

impl Credentials {
    /// Builds the table from the principals of the host configuration.
    pub fn new(principals: &[PrincipalEntry]) -> Credentials {
        let entries = principals
            .iter()
            .map(|p| {
                let principal = Principal {
                    id: p.id.clone(),
                    role: p.role,
                    sessions: p.sessions.clone(),
                };
                (p.token_sha256, Arc::new(principal))
            })
            .collect();
        Credentials { entries }
    }

    /// Number of principals that can authenticate.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no principal can authenticate (every connection will be refused).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal whose token this is, if any.
    ///
    /// Every configured digest is compared, matched or not, so the time taken depends only on
    /// the number of principals. Tokens shorter than [`TOKEN_CHARS_MIN`] never authenticate.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Principal>> {
        if token.chars().count() < TOKEN_CHARS_MIN {
            return None;
        }
        let presented = digest(token);
        let mut found: Option<&Arc<Principal>> = None;
        for (stored, principal) in &self.entries {
            // No early exit: the loop always runs over every entry.
            if constant_time_eq(&presented, stored) && found.is_none() {
                found = Some(principal);
            }
        }
        found.cloned()
    }
}

/// SHA-256 of a token, as stored in `token_sha256`.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A fresh token: [`TOKEN_PREFIX`] and 32 random bytes from the operating system as lowercase
/// hex (68 characters, all URL-safe, so it can travel in a query string unescaped).
pub fn generate_token() -> String {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    if rand::rngs::OsRng.try_fill_bytes(&mut bytes).is_err() {
        // The thread generator is a CSPRNG seeded from the same OS source; it is the only
        // fallback worth having (it panics itself if the OS has no randomness at all).
        tracing::warn!("OS randomness failed once; using the thread CSPRNG for a token");
        rand::rng().fill_bytes(&mut bytes);
    }
    let mut token = String::with_capacity(TOKEN_PREFIX.len() + 2 * TOKEN_RANDOM_BYTES);
    token.push_str(TOKEN_PREFIX);
    token.push_str(&to_hex(&bytes));
    token
}

/// The bearer token of an HTTP upgrade request, if it carries one.
///
/// Looks first for `Authorization: Bearer <token>` (header name and scheme case-insensitive),
/// then for the query parameter `tkn` or `token` (percent-decoded), because the official
/// `ahp-ws` client cannot set headers. `query` is the part after `?` (a leading `?` is ignored).
pub fn token_from_request(headers: &[(String, String)], query: Option<&str>) -> Option<String> {
    for (name, value) in headers {
        if !name.eq_ignore_ascii_case("authorization") {
            continue;
        }
        let value = value.trim();
        let Some((scheme, rest)) = value.split_once([' ', '\t']) else {
            continue;
        };
        let token = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() {
            return Some(token.to_owned());
        }
    }
    let query = query?;
    let query = query.strip_prefix('?').unwrap_or(query);
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "tkn" || key == "token" {
            if let Some(token) = percent_decode(value).filter(|t| !t.is_empty()) {
                return Some(token);
            }
        }
    }
    None
}

/// Compares two digests in time independent of their contents.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b.iter()) {
        diff |= x ^ y;
    }
    // Keeps the optimiser from turning the fold back into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

/// RFC 3986 percent-decoding. `+` stays `+`: tokens are not form-encoded text. Malformed
/// escapes or non-UTF-8 results give `None`.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = hex_value(*bytes.get(i + 1)?)?;
            let lo = hex_value(*bytes.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

/// Parses exactly 64 hex digits (either case) into a digest.
pub(crate) fn digest_from_hex(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = hex_value(pair[0])? << 4 | hex_value(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axhost_core::{Role, SessionScope};

    fn entry(id: &str, role: Role, token: &str) -> PrincipalEntry {
        PrincipalEntry {
            id: id.into(),
            role,
            sessions: SessionScope::All,
            token_sha256: digest(token),
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn digest_is_sha256() {
        assert_eq!(
            to_hex(&digest("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            digest_from_hex(&to_hex(&digest("abc"))),
            Some(digest("abc"))
        );
        assert_eq!(
            digest_from_hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"),
            Some(digest("abc"))
        );
        assert_eq!(digest_from_hex("ab"), None);
        assert_eq!(digest_from_hex(&"g".repeat(64)), None);
    }

    #[test]
    fn generated_tokens_are_long_unique_and_url_safe() {
        let a = generate_token();
        let b = generate_token();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 64);
        assert!(a.len() >= TOKEN_CHARS_MIN);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_'));
    }

    #[test]
    fn authenticate_finds_the_right_principal() {
        let alice = generate_token();
        let bob = generate_token();
        let creds = Credentials::new(&[
            entry("alice", Role::Maintainer, &alice),
            entry("bob", Role::Observer, &bob),
        ]);
        assert_eq!(creds.len(), 2);
        let p = creds.authenticate(&alice).expect("alice");
        assert_eq!((p.id.as_str(), p.role), ("alice", Role::Maintainer));
        let p = creds.authenticate(&bob).expect("bob");
        assert_eq!((p.id.as_str(), p.role), ("bob", Role::Observer));
        assert!(creds.authenticate(&generate_token()).is_none());
        assert!(creds.authenticate("").is_none());
        assert!(!format!("{creds:?}").contains(&to_hex(&digest(&alice))));
    }

    #[test]
    fn short_tokens_never_authenticate() {
        let short = "a".repeat(TOKEN_CHARS_MIN - 1);
        let exact = "a".repeat(TOKEN_CHARS_MIN);
        let creds = Credentials::new(&[
            entry("short", Role::Maintainer, &short),
            entry("exact", Role::Maintainer, &exact),
        ]);
        assert!(creds.authenticate(&short).is_none());
        assert_eq!(
            creds.authenticate(&exact).map(|p| p.id.clone()),
            Some("exact".into())
        );
    }

    #[test]
    fn constant_time_eq_compares_all_bytes() {
        let a = digest("x");
        let mut b = a;
        assert!(constant_time_eq(&a, &b));
        b[31] ^= 1;
        assert!(!constant_time_eq(&a, &b));
        b = a;
        b[0] ^= 0x80;
        assert!(!constant_time_eq(&a, &b));
    }

    #[test]
    fn bearer_header_in_any_case() {
        let h = headers(&[("Host", "x"), ("AUTHORIZATION", "bEaReR  tok123  ")]);
        assert_eq!(token_from_request(&h, None), Some("tok123".into()));
        let h = headers(&[("authorization", "Basic dXNlcjpwYXNz")]);
        assert_eq!(token_from_request(&h, None), None);
        let h = headers(&[("authorization", "Bearer")]);
        assert_eq!(token_from_request(&h, None), None);
        let h = headers(&[("authorization", "Basic x"), ("Authorization", "Bearer t2")]);
        assert_eq!(token_from_request(&h, None), Some("t2".into()));
    }

    #[test]
    fn header_wins_over_query() {
        let h = headers(&[("Authorization", "Bearer fromheader")]);
        assert_eq!(
            token_from_request(&h, Some("tkn=fromquery")),
            Some("fromheader".into())
        );
    }

    #[test]
    fn query_parameters_are_decoded() {
        assert_eq!(token_from_request(&[], Some("tkn=abc")), Some("abc".into()));
        assert_eq!(
            token_from_request(&[], Some("?token=a%2Bb%20c")),
            Some("a+b c".into())
        );
        assert_eq!(
            token_from_request(&[], Some("x=1&token=a+b")),
            Some("a+b".into())
        );
        assert_eq!(
            token_from_request(&[], Some("tkn=&token=z")),
            Some("z".into())
        );
        assert_eq!(token_from_request(&[], Some("tkn=%zz")), None);
        assert_eq!(token_from_request(&[], Some("tkn=%f")), None);
        assert_eq!(token_from_request(&[], Some("tkn=%ff")), None);
        assert_eq!(token_from_request(&[], Some("tokens=abc&xtkn=abc")), None);
        assert_eq!(token_from_request(&[], Some("")), None);
        assert_eq!(token_from_request(&[], None), None);
    }
}
