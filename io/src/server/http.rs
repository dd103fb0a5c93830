//! HTTP/1.1 request heads: bounded parsing, routing, and the few fixed responses the host
//! writes before a connection becomes a WebSocket (or is closed).
//!
//! Everything here is pure: bytes in, decisions and bytes out. The driver in `server.rs` owns the
//! sockets, the credentials and the connection count.
//!
//! [`parse_head`], [`route`] and [`origin_allowed`] are public so the `websocket` fuzz target
//! (`fuzz/src/websocket.rs`) runs the server's own decisions rather than a copy. The driver
//! applies them in this order: [`parse_head`] on the bytes read so far (at most
//! [`HEAD_BYTES_MAX`]), [`route`] on a complete [`Request`], then the token
//! (`credentials::token_from_request` and `Credentials::authenticate`, 401), then
//! [`origin_allowed`] (403), then capacity (503).

use axhost_core::AXP_VERSION;

/// Largest request head the host reads. A head that does not end within it is answered 431.
pub const HEAD_BYTES_MAX: usize = 16 * 1024;

/// Most header lines in one request head. More is answered 431.
const HEADERS_MAX: usize = 64;

/// One parsed request head. Header values that are not UTF-8 are decoded lossily: the host only
/// compares them with ASCII tokens, so a lossy value can only fail a comparison.
///
/// Only [`parse_head`] makes one; outside the crate it is read through its accessors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub(crate) method: String,
    /// The path without the query string.
    pub(crate) path: String,
    /// The query string without `?`, when the target had one.
    pub(crate) query: Option<String>,
    /// Minor HTTP version: 1 for HTTP/1.1, 0 for HTTP/1.0.
    pub(crate) version_minor: u8,
    /// Header names and values, in request order.
    pub(crate) headers: Vec<(String, String)>,
}

impl Request {
    /// The method: `GET`, `POST`, ...
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The path without the query string.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The query string without `?`, when the target had one (possibly empty).
    pub fn query(&self) -> Option<&str> {
        self.query.as_deref()
    }

    /// Minor HTTP version: 1 for HTTP/1.1, 0 for HTTP/1.0.
    pub fn version_minor(&self) -> u8 {
        self.version_minor
    }

    /// Header names and values, in request order, values untrimmed (what
    /// `credentials::token_from_request` takes).
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The first value of header `name` (case-insensitive), trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    }

    /// Whether any value of header `name` lists `token` in its comma-separated list.
    fn header_has_token(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }
}

/// What the bytes read so far amount to.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// The head has not ended yet; read more (the caller keeps the buffer under
    /// [`HEAD_BYTES_MAX`]).
    Partial,
    /// A whole head. `len` bytes of the buffer belong to it; any bytes after it were sent early.
    Complete {
        /// The request.
        request: Request,
        /// Length of the head in bytes, including the blank line.
        len: usize,
    },
    /// Not HTTP we can serve; answer with this status and close.
    Invalid(Status),
}

/// Parses the request head at the start of `buf`. More than 64 header lines, or a head that has
/// not ended within [`HEAD_BYTES_MAX`] bytes, is [`Status::HeaderFieldsTooLarge`]; anything else
/// `httparse` refuses is [`Status::BadRequest`].
pub fn parse_head(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() >= HEAD_BYTES_MAX => {
            Head::Invalid(Status::HeaderFieldsTooLarge)
        }
        Ok(httparse::Status::Partial) => Head::Partial,
        Ok(httparse::Status::Complete(len)) => {
            let (Some(method), Some(target), Some(version_minor)) =
                (req.method, req.path, req.version)
            else {
                return Head::Invalid(Status::BadRequest);
            };
            let (path, query) = match target.split_once('?') {
                Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
                None => (target.to_owned(), None),
            };
            let headers = req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_owned(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            Head::Complete {
                request: Request {
                    method: method.to_owned(),
                    path,
                    query,
                    version_minor,
                    headers,
                },
                len,
            }
        }
        Err(httparse::Error::TooManyHeaders) => Head::Invalid(Status::HeaderFieldsTooLarge),
        Err(_) => Head::Invalid(Status::BadRequest),
    }
}

/// Where a complete request goes, before credentials and capacity are checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /healthz`.
    Health,
    /// A well-formed WebSocket upgrade on `/axp` or `/`, with its `Sec-WebSocket-Key`.
    Upgrade {
        /// The client's key, for `Sec-WebSocket-Accept`.
        key: String,
    },
    /// Answer with this status and close.
    Reject(Status),
}

/// Routes a request by method, path and upgrade headers: `GET /healthz` is [`Route::Health`];
/// `GET /axp` or `GET /` must be an RFC 6455 version-13 upgrade over HTTP/1.1 (426 without
/// `Upgrade: websocket` or version 13, 400 without `Connection: upgrade` or a key); anything else
/// is 404.
pub fn route(req: &Request) -> Route {
    match req.path.as_str() {
        "/healthz" if req.method == "GET" => Route::Health,
        "/axp" | "/" if req.method == "GET" => upgrade(req),
        _ => Route::Reject(Status::NotFound),
    }
}

/// Checks the RFC 6455 upgrade requirements (section 4.2.1).
fn upgrade(req: &Request) -> Route {
    if !req.header_has_token("upgrade", "websocket") {
        return Route::Reject(Status::UpgradeRequired);
    }
    if req.version_minor < 1 || !req.header_has_token("connection", "upgrade") {
        return Route::Reject(Status::BadRequest);
    }
    if req.header("sec-websocket-version") != Some("13") {
        return Route::Reject(Status::UpgradeRequired);
    }
    match req.header("sec-websocket-key") {
        Some(key) if !key.is_empty() => Route::Upgrade {
            key: key.to_owned(),
        },
        _ => Route::Reject(Status::BadRequest),
    }
}

/// Whether `origin` may open a WebSocket. No allow-list, or no `Origin` header (not a browser),
/// always may. Origins compare ASCII-case-insensitively.
pub fn origin_allowed(allowed: Option<&[String]>, origin: Option<&str>) -> bool {
    match (allowed, origin) {
        (Some(list), Some(origin)) => list.iter().any(|a| a.trim().eq_ignore_ascii_case(origin)),
        _ => true,
    }
}

/// The statuses the host answers with.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// 200, `/healthz`.
    Ok,
    /// 400, a head that is not HTTP/1.1 or an upgrade missing a required header.
    BadRequest,
    /// 401, missing or unknown token.
    Unauthorized,
    /// 403, an `Origin` not on the allow-list.
    Forbidden,
    /// 404, any other path or method.
    NotFound,
    /// 426, a request on the WebSocket path that is not a version-13 upgrade.
    UpgradeRequired,
    /// 431, a head over [`HEAD_BYTES_MAX`] or with too many header lines.
    HeaderFieldsTooLarge,
    /// 503, the host is at `connections_max`.
    ServiceUnavailable,
}

impl Status {
    /// The numeric code.
    pub fn code(self) -> u16 {
        match self {
            Status::Ok => 200,
            Status::BadRequest => 400,
            Status::Unauthorized => 401,
            Status::Forbidden => 403,
            Status::NotFound => 404,
            Status::UpgradeRequired => 426,
            Status::HeaderFieldsTooLarge => 431,
            Status::ServiceUnavailable => 503,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::BadRequest => "Bad Request",
            Status::Unauthorized => "Unauthorized",
            Status::Forbidden => "Forbidden",
            Status::NotFound => "Not Found",
            Status::UpgradeRequired => "Upgrade Required",
            Status::HeaderFieldsTooLarge => "Request Header Fields Too Large",
            Status::ServiceUnavailable => "Service Unavailable",
        }
    }
}

/// The `/healthz` body.
pub(crate) fn health_body() -> String {
    format!(r#"{{"status":"ok","protocol":"{AXP_VERSION}"}}"#)
}

/// A complete response that ends the connection: status line, fixed headers, body.
pub(crate) fn response(status: Status, body: &str) -> Vec<u8> {
    let extra = match status {
        Status::Unauthorized => "WWW-Authenticate: Bearer\r\n",
        Status::UpgradeRequired => "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n",
        Status::ServiceUnavailable => "Retry-After: 1\r\n",
        _ => "",
    };
    let content_type = if body.is_empty() {
        ""
    } else {
        "Content-Type: application/json\r\n"
    };
    format!(
        "HTTP/1.1 {} {}\r\n{extra}{content_type}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        status.code(),
        status.reason(),
        body.len()
    )
    .into_bytes()
}

/// The `101` that turns the connection into a WebSocket. It carries no
/// `Sec-WebSocket-Protocol`: the official client requests none and refuses one it did not ask for.
pub(crate) fn switching_protocols(key: &str) -> Vec<u8> {
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(raw: &str) -> (Request, usize) {
        match parse_head(raw.as_bytes()) {
            Head::Complete { request, len } => (request, len),
            other => panic!("expected a complete head, got {other:?}"),
        }
    }

    const UPGRADE: &str = "GET /axp?tkn=abc HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
        Connection: keep-alive, Upgrade\r\nSec-WebSocket-Version: 13\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";

    #[test]
    fn parses_path_query_headers_and_length() {
        let (req, len) = complete(UPGRADE);
        assert_eq!(len, UPGRADE.len());
        assert_eq!(req.method, "GET");
        assert_eq!(req.path, "/axp");
        assert_eq!(req.query.as_deref(), Some("tkn=abc"));
        assert_eq!(req.version_minor, 1);
        assert_eq!(req.header("HOST"), Some("x"));
        assert_eq!(
            route(&req),
            Route::Upgrade {
                key: "dGhlIHNhbXBsZSBub25jZQ==".into()
            }
        );
    }

    #[test]
    fn early_bytes_after_the_head_are_not_part_of_it() {
        let raw = format!("{UPGRADE}\u{81}\u{0}");
        let (_, len) = complete(&raw);
        assert_eq!(len, UPGRADE.len());
    }

    #[test]
    fn partial_heads_wait_until_the_bound() {
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nHost: x\r\n"), Head::Partial);
        let mut big = b"GET / HTTP/1.1\r\nX-Pad: ".to_vec();
        big.resize(HEAD_BYTES_MAX, b'a');
        assert_eq!(
            parse_head(&big),
            Head::Invalid(Status::HeaderFieldsTooLarge)
        );
    }

    #[test]
    fn garbage_and_header_floods_are_refused() {
        assert_eq!(
            parse_head(b"\x16\x03\x01\x02\x00\r\n\r\n"),
            Head::Invalid(Status::BadRequest)
        );
        let mut flood = String::from("GET / HTTP/1.1\r\n");
        for i in 0..=HEADERS_MAX {
            flood.push_str(&format!("X-{i}: y\r\n"));
        }
        flood.push_str("\r\n");
        assert_eq!(
            parse_head(flood.as_bytes()),
            Head::Invalid(Status::HeaderFieldsTooLarge)
        );
    }

    #[test]
    fn routes_health_root_and_unknown_paths() {
        let (req, _) = complete("GET /healthz HTTP/1.1\r\n\r\n");
        assert_eq!(route(&req), Route::Health);
        let (req, _) = complete("POST /healthz HTTP/1.1\r\n\r\n");
        assert_eq!(route(&req), Route::Reject(Status::NotFound));
        let (req, _) = complete("GET /other HTTP/1.1\r\n\r\n");
        assert_eq!(route(&req), Route::Reject(Status::NotFound));
        let root = UPGRADE.replacen("/axp?tkn=abc", "/", 1);
        let (req, _) = complete(&root);
        assert!(matches!(route(&req), Route::Upgrade { .. }));
    }

    #[test]
    fn incomplete_upgrades_are_refused() {
        let (req, _) = complete("GET /axp HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(route(&req), Route::Reject(Status::UpgradeRequired));
        let v8 = UPGRADE.replacen("Version: 13", "Version: 8", 1);
        let (req, _) = complete(&v8);
        assert_eq!(route(&req), Route::Reject(Status::UpgradeRequired));
        let no_key = UPGRADE.replacen("Sec-WebSocket-Key", "X-Key", 1);
        let (req, _) = complete(&no_key);
        assert_eq!(route(&req), Route::Reject(Status::BadRequest));
        let http10 = UPGRADE.replacen("HTTP/1.1", "HTTP/1.0", 1);
        let (req, _) = complete(&http10);
        assert_eq!(route(&req), Route::Reject(Status::BadRequest));
        let no_conn = UPGRADE.replacen("keep-alive, Upgrade", "keep-alive", 1);
        let (req, _) = complete(&no_conn);
        assert_eq!(route(&req), Route::Reject(Status::BadRequest));
    }

    #[test]
    fn origins_are_checked_only_against_a_list() {
        let list = vec!["https://app.example".to_owned()];
        assert!(origin_allowed(None, Some("https://evil.example")));
        assert!(origin_allowed(Some(&list), None));
        assert!(origin_allowed(Some(&list), Some("HTTPS://APP.example")));
        assert!(!origin_allowed(Some(&list), Some("https://evil.example")));
    }

    #[test]
    fn responses_are_exact() {
        assert_eq!(health_body(), r#"{"status":"ok","protocol":"0.2.0"}"#);
        let r = String::from_utf8(response(Status::Ok, &health_body())).unwrap_or_default();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains("Content-Type: application/json\r\nContent-Length: 34\r\n"),
            "{r}"
        );
        assert!(
            r.ends_with("\r\n\r\n{\"status\":\"ok\",\"protocol\":\"0.2.0\"}"),
            "{r}"
        );
        let r = String::from_utf8(response(Status::Unauthorized, "")).unwrap_or_default();
        assert!(r.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{r}");
        let r =
            String::from_utf8(switching_protocols("dGhlIHNhbXBsZSBub25jZQ==")).unwrap_or_default();
        assert!(
            r.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
            "{r}"
        );
        assert!(
            !r.to_ascii_lowercase().contains("sec-websocket-protocol"),
            "{r}"
        );
    }
}
