//! The frames `axhost-axp` sends, built by hand, and the scanners that read the host's frames
//! without parsing them whole (tens of thousands a second on a 2-core machine shared with the
//! host). Every `_axp/*` frame carries exactly the keys its schema allows (`schema/axp/`):
//! the host rejects unknown keys with `-32602`.

/// A fixed `startedAt`: the host replaces it with its own clock.
const STARTED_AT: &str = "2020-01-01T00:00:00.000Z";

/// Marks the send time stamped into an emitted action's content: `@T<ns>@`, nanoseconds
/// since the tool's start on its monotonic clock.
pub const STAMP: &str = "@T";

/// A request frame: `{"jsonrpc":"2.0","id":ID,"method":METHOD,"params":PARAMS}`.
fn request(id: u64, method: &str, params: &str) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{params}}}")
}

pub fn create_session(id: u64, session: &str) -> String {
    request(
        id,
        "createSession",
        &format!("{{\"channel\":\"ahp-session:/{session}\"}}"),
    )
}

pub fn subscribe(id: u64, channel: &str) -> String {
    request(id, "subscribe", &format!("{{\"channel\":\"{channel}\"}}"))
}

/// `_axp/register` on `axp-executors://` (any readable channel is accepted).
pub fn register(id: u64, op: &str, executor: &str, ttl_ms: u64) -> String {
    request(
        id,
        "_axp/register",
        &format!(
            "{{\"channel\":\"axp-executors://\",\"operationId\":\"{op}\",\"executorId\":\"{executor}\",\
             \"name\":\"axhost-axp\",\"placement\":\"satellite\",\"capabilities\":[\"acp/v1\"],\
             \"ttlMs\":{ttl_ms}}}"
        ),
    )
}

/// `_axp/grant` with the same `limit` in every unit, accounting enforcement.
pub fn grant(id: u64, session: &str, op: &str, grant: &str, limit: u64) -> String {
    request(
        id,
        "_axp/grant",
        &format!(
            "{{\"channel\":\"axp-session:/{session}\",\"operationId\":\"{op}\",\"grantId\":\"{grant}\",\
             \"limit\":{{\"tokens\":{limit},\"costMicros\":{limit},\"turns\":{limit}}},\
             \"enforcement\":\"accounting\"}}"
        ),
    )
}

pub fn claim(
    id: u64,
    session: &str,
    op: &str,
    executor: &str,
    grant: &str,
    lease_ms: u64,
) -> String {
    request(
        id,
        "_axp/claim",
        &format!(
            "{{\"channel\":\"axp-session:/{session}\",\"operationId\":\"{op}\",\"executorId\":\"{executor}\",\
             \"grantId\":\"{grant}\",\"leaseMs\":{lease_ms}}}"
        ),
    )
}

pub fn renew(id: u64, session: &str, op: &str, epoch: u64) -> String {
    request(
        id,
        "_axp/renew",
        &format!(
            "{{\"channel\":\"axp-session:/{session}\",\"operationId\":\"{op}\",\"epoch\":{epoch}}}"
        ),
    )
}

/// `_axp/reserve` of one turn with a positive token ceiling.
pub fn reserve(id: u64, session: &str, op: &str, epoch: u64, turn: &str, tokens: u64) -> String {
    request(
        id,
        "_axp/reserve",
        &format!(
            "{{\"channel\":\"axp-session:/{session}\",\"operationId\":\"{op}\",\"epoch\":{epoch},\
             \"turnId\":\"{turn}\",\"ceiling\":{{\"tokens\":{tokens},\"costMicros\":{tokens},\"turns\":1}}}}"
        ),
    )
}

/// What one settle reports: a truthful usage inside the reservation's ceiling.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cost_micros: u64,
}

/// `_axp/settle` with outcome `complete` and reported usage.
pub fn settle(id: u64, session: &str, op: &str, epoch: u64, turn: &str, u: Usage) -> String {
    request(
        id,
        "_axp/settle",
        &format!(
            "{{\"channel\":\"axp-session:/{session}\",\"operationId\":\"{op}\",\"epoch\":{epoch},\
             \"turnId\":\"{turn}\",\"usage\":{{\"inputTokens\":{},\"outputTokens\":{},\
             \"cacheReadTokens\":{},\"costMicros\":{},\"source\":\"reported\"}},\"outcome\":\"complete\"}}",
            u.input, u.output, u.cache_read, u.cost_micros
        ),
    )
}

/// `_axp/emit` of `batch` actions on `turn`: the turn's first emit opens markdown part `part`
/// with a `chat/responsePart`, every later action is a `chat/delta` on it. Only the last
/// action carries the send stamp (`@T<stamp_ns>@`), so each viewer records one latency per
/// emit: the time until the whole batch reached it.
#[allow(clippy::too_many_arguments)]
pub fn emit(
    id: u64,
    session: &str,
    op: &str,
    epoch: u64,
    turn: &str,
    part: &str,
    opens_part: bool,
    batch: u32,
    stamp_ns: u64,
) -> String {
    let mut actions = String::with_capacity(96 * batch as usize);
    for k in 0..batch {
        if k > 0 {
            actions.push(',');
        }
        let content = if k + 1 == batch {
            format!("{STAMP}{stamp_ns}@")
        } else {
            "tok ".to_owned()
        };
        if k == 0 && opens_part {
            actions.push_str(&format!(
                "{{\"type\":\"chat/responsePart\",\"turnId\":\"{turn}\",\"part\":{{\"kind\":\"markdown\",\
                 \"id\":\"{part}\",\"content\":\"{content}\"}}}}"
            ));
        } else {
            actions.push_str(&format!(
                "{{\"type\":\"chat/delta\",\"turnId\":\"{turn}\",\"partId\":\"{part}\",\"content\":\"{content}\"}}"
            ));
        }
    }
    request(
        id,
        "_axp/emit",
        &format!(
            "{{\"channel\":\"axp-session:/{session}\",\"operationId\":\"{op}\",\"epoch\":{epoch},\
             \"actions\":[{actions}]}}"
        ),
    )
}

/// The maintainer's `dispatchAction` of `chat/turnStarted` (user origin), as a request.
pub fn turn_started(id: u64, session: &str, seq: u64, turn: &str) -> String {
    request(
        id,
        "dispatchAction",
        &format!(
            "{{\"channel\":\"ahp-chat:/{session}\",\"clientSeq\":{seq},\"action\":{{\"type\":\"chat/turnStarted\",\
             \"turnId\":\"{turn}\",\"startedAt\":\"{STARTED_AT}\",\"message\":{{\"text\":\"bench turn\",\
             \"origin\":{{\"kind\":\"user\"}}}}}}}}"
        ),
    )
}

/// The maintainer's `dispatchAction` of `chat/pendingMessageSet` (queued, user origin): the
/// host starts it as the next turn when the current one settles complete.
pub fn queue_message(id: u64, session: &str, seq: u64, message_id: &str) -> String {
    request(
        id,
        "dispatchAction",
        &format!(
            "{{\"channel\":\"ahp-chat:/{session}\",\"clientSeq\":{seq},\"action\":{{\"type\":\"chat/pendingMessageSet\",\
             \"kind\":\"queued\",\"id\":\"{message_id}\",\"message\":{{\"text\":\"bench turn\",\
             \"origin\":{{\"kind\":\"user\"}}}}}}}}"
        ),
    )
}

// ─── Reading ─────────────────────────────────────────────────────────────────

/// What a frame from the host is.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming<'a> {
    /// A response: its id and, for an error, its code (`None`: a result).
    Reply { id: u64, error: Option<i64> },
    /// An `action` envelope on `channel`.
    Action { channel: &'a str },
    /// Any other notification (`root/…`, `session/…`), or a response whose id is not a number.
    Other,
}

const REPLY_HEAD: &str = "{\"jsonrpc\":\"2.0\",\"id\":";
const ACTION_HEAD: &str = "{\"jsonrpc\":\"2.0\",\"method\":\"action\",\"params\":";

/// The unsigned integer at the start of `s`, and the rest.
fn leading_u64(s: &str) -> Option<(u64, &str)> {
    let end = s
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    let n = s.get(..end)?.parse().ok()?;
    Some((n, &s[end..]))
}

/// The (possibly negative) integer after the first `"key":` in `text`.
pub fn int_after(text: &str, key: &str) -> Option<i64> {
    let needle = format!("\"{key}\":");
    let at = text.find(&needle)? + needle.len();
    let rest = &text[at..];
    let (neg, rest) = match rest.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let (n, _) = leading_u64(rest)?;
    let n = i64::try_from(n).ok()?;
    Some(if neg { -n } else { n })
}

/// The string value of the first `"key":"…"` in `text` (no escapes expected: every string
/// the tool looks for is one it chose, or an id the host made from `[A-Za-z0-9-]`).
pub fn str_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let needle = format!("\"{key}\":\"");
    let at = text.find(&needle)? + needle.len();
    let rest = &text[at..];
    rest.find('"').map(|end| &rest[..end])
}

/// Classifies a frame from the host. The host writes responses as
/// `{"jsonrpc":"2.0","id":ID,"result"|"error":…}` and notifications as
/// `{"jsonrpc":"2.0","method":…,"params":…}` (`core/src/net/wire.rs`); anything else falls
/// back to a key search.
pub fn classify(text: &str) -> Incoming<'_> {
    if let Some(rest) = text.strip_prefix(REPLY_HEAD) {
        let Some((id, rest)) = leading_u64(rest) else {
            return Incoming::Other;
        };
        let error = if rest.starts_with(",\"error\"") {
            Some(int_after(rest, "code").unwrap_or(0))
        } else {
            None
        };
        return Incoming::Reply { id, error };
    }
    if let Some(rest) = text.strip_prefix(ACTION_HEAD) {
        return match str_after(rest, "channel") {
            Some(channel) => Incoming::Action { channel },
            None => Incoming::Other,
        };
    }
    if text.contains("\"method\"") {
        if text.contains("\"method\":\"action\"") {
            if let Some(channel) = str_after(text, "channel") {
                return Incoming::Action { channel };
            }
        }
        return Incoming::Other;
    }
    // A response written some other way: find its id and whether it is an error.
    match int_after(text, "id").and_then(|id| u64::try_from(id).ok()) {
        Some(id) => Incoming::Reply {
            id,
            error: text
                .contains("\"error\"")
                .then(|| int_after(text, "code").unwrap_or(0)),
        },
        None => Incoming::Other,
    }
}

/// The send stamp in an envelope's content, if it carries one.
pub fn stamp(text: &str) -> Option<u64> {
    let at = text.find(STAMP)? + STAMP.len();
    let (n, rest) = leading_u64(&text[at..])?;
    rest.starts_with('@').then_some(n)
}

/// Whether an envelope on an exchange channel is a `_axp/leaseChanged` that takes the lease
/// away (`"lease":null`).
pub fn lease_lost(text: &str) -> bool {
    text.contains("\"_axp/leaseChanged\"") && text.contains("\"lease\":null")
}

/// The `turnId` of a `chat/turnStarted` envelope.
pub fn started_turn(text: &str) -> Option<&str> {
    if !text.contains("\"chat/turnStarted\"") {
        return None;
    }
    str_after(text, "turnId")
}

/// The session index in `channel` when it is `{scheme}{prefix}-{index}`.
pub fn session_index(channel: &str, scheme: &str, prefix: &str) -> Option<usize> {
    let rest = channel.strip_prefix(scheme)?.strip_prefix(prefix)?;
    let rest = rest.strip_prefix('-')?;
    rest.parse().ok()
}

/// The message of an error response (for the report's samples).
pub fn error_message(text: &str) -> &str {
    str_after(text, "message").unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    fn keys(v: &serde_json::Value) -> Vec<&str> {
        let mut k: Vec<&str> = v
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        k.sort_unstable();
        k
    }

    #[test]
    fn axp_frames_carry_exactly_the_schema_keys() {
        let r = json(&register(2, "reg-1", "x-1", 30000));
        assert_eq!(r["method"], "_axp/register");
        assert_eq!(
            keys(&r["params"]),
            [
                "capabilities",
                "channel",
                "executorId",
                "name",
                "operationId",
                "placement",
                "ttlMs"
            ]
        );
        let g = json(&grant(3, "s-1", "g-op", "g-1", 1_000_000));
        assert_eq!(
            keys(&g["params"]),
            ["channel", "enforcement", "grantId", "limit", "operationId"]
        );
        assert_eq!(
            keys(&g["params"]["limit"]),
            ["costMicros", "tokens", "turns"]
        );
        assert_eq!(g["params"]["channel"], "axp-session:/s-1");
        let c = json(&claim(4, "s-1", "c-op", "x-1", "g-1", 30000));
        assert_eq!(
            keys(&c["params"]),
            ["channel", "executorId", "grantId", "leaseMs", "operationId"]
        );
        let n = json(&renew(5, "s-1", "r-op", 3));
        assert_eq!(keys(&n["params"]), ["channel", "epoch", "operationId"]);
        let v = json(&reserve(6, "s-1", "v-op", 3, "t-1-1", 1000));
        assert_eq!(
            keys(&v["params"]),
            ["ceiling", "channel", "epoch", "operationId", "turnId"]
        );
        assert_eq!(v["params"]["ceiling"]["turns"], 1);
        let u = Usage {
            input: 100,
            output: 50,
            cache_read: 40,
            cost_micros: 7,
        };
        let s = json(&settle(7, "s-1", "s-op", 3, "t-1-1", u));
        assert_eq!(
            keys(&s["params"]),
            [
                "channel",
                "epoch",
                "operationId",
                "outcome",
                "turnId",
                "usage"
            ]
        );
        assert_eq!(
            keys(&s["params"]["usage"]),
            [
                "cacheReadTokens",
                "costMicros",
                "inputTokens",
                "outputTokens",
                "source"
            ]
        );
        assert_eq!(s["params"]["outcome"], "complete");
    }

    #[test]
    fn emits_open_a_part_then_append_to_it_with_the_stamp_last() {
        let first = json(&emit(8, "s-1", "e-1", 3, "t-1", "p-1", true, 3, 42));
        let p = &first["params"];
        assert_eq!(keys(p), ["actions", "channel", "epoch", "operationId"]);
        let a = p["actions"].as_array().expect("actions");
        assert_eq!(a.len(), 3);
        assert_eq!(a[0]["type"], "chat/responsePart");
        assert_eq!(a[0]["part"]["kind"], "markdown");
        assert_eq!(a[0]["part"]["id"], "p-1");
        assert_eq!(a[1]["type"], "chat/delta");
        assert_eq!(a[1]["partId"], "p-1");
        assert_eq!(a[2]["content"], "@T42@");
        assert_eq!(stamp(&a[2].to_string()), Some(42));
        assert_eq!(stamp(&a[1].to_string()), None);
        let later = json(&emit(9, "s-1", "e-2", 3, "t-1", "p-1", false, 1, 7));
        let a = later["params"]["actions"].as_array().expect("actions");
        assert_eq!(a.len(), 1);
        assert_eq!(
            (&a[0]["type"], &a[0]["content"]),
            (&"chat/delta".into(), &"@T7@".into())
        );
        let opening = json(&emit(10, "s-1", "e-3", 3, "t-2", "p-2", true, 1, 9));
        let a = opening["params"]["actions"].as_array().expect("actions");
        assert_eq!(a[0]["part"]["content"], "@T9@");
    }

    #[test]
    fn dispatches_are_requests_with_user_messages() {
        let t = json(&turn_started(11, "s-1", 4, "t-1-2"));
        assert_eq!(
            (&t["id"], &t["method"]),
            (&11.into(), &"dispatchAction".into())
        );
        assert_eq!(t["params"]["channel"], "ahp-chat:/s-1");
        assert_eq!(t["params"]["clientSeq"], 4);
        assert_eq!(t["params"]["action"]["type"], "chat/turnStarted");
        assert_eq!(t["params"]["action"]["message"]["origin"]["kind"], "user");
        let q = json(&queue_message(12, "s-1", 5, "q-1"));
        assert_eq!(q["params"]["action"]["type"], "chat/pendingMessageSet");
        assert_eq!(q["params"]["action"]["kind"], "queued");
        let c = json(&create_session(1, "s-1"));
        assert_eq!(c["params"]["channel"], "ahp-session:/s-1");
        assert_eq!(
            json(&subscribe(2, "ahp-chat:/s-1"))["params"]["channel"],
            "ahp-chat:/s-1"
        );
    }

    #[test]
    fn classifies_replies_envelopes_and_the_rest() {
        assert_eq!(
            classify(r#"{"jsonrpc":"2.0","id":12,"result":null}"#),
            Incoming::Reply {
                id: 12,
                error: None
            }
        );
        assert_eq!(
            classify(
                r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32040,"message":"Executor lease is stale"}}"#
            ),
            Incoming::Reply {
                id: 7,
                error: Some(-32040)
            }
        );
        assert_eq!(
            classify(r#"{"error":{"message":"m","code":-32602},"id":5,"jsonrpc":"2.0"}"#),
            Incoming::Reply {
                id: 5,
                error: Some(-32602)
            }
        );
        let env = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/bench-3","serverSeq":9,"action":{"type":"chat/delta","turnId":"t","partId":"p","content":"@T123@"}}}"#;
        assert_eq!(
            classify(env),
            Incoming::Action {
                channel: "ahp-chat:/bench-3"
            }
        );
        assert_eq!(stamp(env), Some(123));
        assert_eq!(
            session_index("ahp-chat:/bench-3", "ahp-chat:/", "bench"),
            Some(3)
        );
        assert_eq!(
            session_index("ahp-chat:/benchx-3", "ahp-chat:/", "bench"),
            None
        );
        assert_eq!(
            classify(r#"{"jsonrpc":"2.0","method":"root/sessionAdded","params":{}}"#),
            Incoming::Other
        );
        let lost = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"axp-session:/bench-1","serverSeq":3,"action":{"type":"_axp/leaseChanged","lease":null,"epoch":2,"status":"orphaned"}}}"#;
        assert!(lease_lost(lost));
        let kept = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"axp-session:/bench-1","serverSeq":3,"action":{"type":"_axp/leaseChanged","lease":{"owner":"c"},"epoch":2,"status":"open"}}}"#;
        assert!(!lease_lost(kept));
        let started = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/bench-1","serverSeq":4,"action":{"type":"chat/turnStarted","turnId":"0b6c-11","startedAt":"x","message":{"text":"t","origin":{"kind":"user"}},"queuedMessageId":"q"}}}"#;
        assert_eq!(started_turn(started), Some("0b6c-11"));
        assert_eq!(started_turn(env), None);
        assert_eq!(int_after(r#"{"epoch":17,"x":1}"#, "epoch"), Some(17));
        assert_eq!(
            error_message(r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32040,"message":"stale"}}"#),
            "stale"
        );
    }
}
