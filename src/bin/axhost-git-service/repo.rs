//! Reading one repository with gix: refs, objects, chunks of large objects.

use std::path::Path;

use base64::Engine as _;
use gix::ObjectId;
use serde_json::{json, Value};

/// Most object ids in one `getObjects` call.
pub const MAX_OIDS: usize = 256;
/// Most base64 content bytes in one result (`getObjects` total, `getObjectChunk`): 768 KiB, so a
/// full result with 256 entries of envelope stays well under the host's 1 MiB payload limit.
pub const MAX_CONTENT_BYTES: usize = 768 * 1024;
/// Most raw bytes in one `getObjectChunk` (its base64 form is [`MAX_CONTENT_BYTES`]).
pub const MAX_CHUNK_BYTES: usize = MAX_CONTENT_BYTES / 4 * 3;

/// A failure answered as a JSON-RPC error.
#[derive(Debug)]
pub struct MethodError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

/// `-32602`: the caller's params are wrong.
pub const INVALID_PARAMS: i64 = -32602;
/// `-32603`: reading the repository failed.
pub const INTERNAL_ERROR: i64 = -32603;

impl MethodError {
    pub fn invalid(message: impl Into<String>, data: Option<Value>) -> MethodError {
        MethodError {
            code: INVALID_PARAMS,
            message: message.into(),
            data,
        }
    }

    fn internal(what: &str, e: impl std::fmt::Display) -> MethodError {
        MethodError {
            code: INTERNAL_ERROR,
            message: format!("{what}: {e}"),
            data: None,
        }
    }
}

/// Where a ref points, unpeeled.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RefTarget {
    Object(ObjectId),
    /// The ref it names, and the object that chain ends at (if it resolves).
    Symbolic(String, Option<ObjectId>),
}

/// All refs and HEAD, unpeeled, ordered by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefState {
    refs: Vec<(String, RefTarget)>,
    head: (Option<String>, Option<ObjectId>),
}

/// One repository on disk, kept open.
pub struct Repo {
    repo: gix::Repository,
}

/// Base64 length of `n` bytes (standard alphabet, padded).
pub fn encoded_len(n: u64) -> u64 {
    n.div_ceil(3) * 4
}

/// A 40-hex-digit object id, or `-32602` naming it.
pub fn parse_oid(text: &str) -> Result<ObjectId, MethodError> {
    let bad = || MethodError::invalid("oid must be 40 hex digits", Some(json!({ "oid": text })));
    if text.len() != 40 {
        return Err(bad());
    }
    ObjectId::from_hex(text.as_bytes()).map_err(|_| bad())
}

impl Repo {
    pub fn open(path: &Path) -> Result<Repo, String> {
        let repo = gix::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Repo { repo })
    }

    /// Where every ref (whose name starts with `prefix`) and HEAD point, unpeeled: cheap to
    /// read and compare, so the poller only builds JSON when something moved.
    pub fn ref_state(&self, prefix: Option<&str>) -> Result<RefState, MethodError> {
        let platform = self
            .repo
            .references()
            .map_err(|e| MethodError::internal("listing refs", e))?;
        let iter = platform
            .all()
            .map_err(|e| MethodError::internal("listing refs", e))?;
        let mut refs = Vec::new();
        for r in iter {
            let r = r.map_err(|e| MethodError::internal("reading a ref", e))?;
            let name = r.name().as_bstr().to_string();
            if prefix.is_some_and(|p| !name.starts_with(p)) {
                continue;
            }
            let target = match r.target() {
                gix::refs::TargetRef::Object(oid) => RefTarget::Object(oid.to_owned()),
                gix::refs::TargetRef::Symbolic(to) => {
                    let mut peel = r.clone();
                    let resolved = peel.peel_to_id().ok().map(|id| id.detach());
                    RefTarget::Symbolic(to.as_bstr().to_string(), resolved)
                }
            };
            refs.push((name, target));
        }
        refs.sort();
        let head = match self.repo.head() {
            Ok(h) => (
                h.referent_name().map(|n| n.as_bstr().to_string()),
                h.id().map(|id| id.detach()),
            ),
            Err(_) => (None, None),
        };
        Ok(RefState { refs, head })
    }

    /// `{refs: [{name, target, peeled?} | {name, symref, target?}], head: {name: "HEAD", symref?,
    /// target?}}`, refs ordered by name. `peeled` is the first non-tag object of an annotated
    /// tag (looked for under `refs/tags/`).
    pub fn refs_json(&self, state: &RefState) -> Value {
        let refs: Vec<Value> = state
            .refs
            .iter()
            .map(|(name, target)| match target {
                RefTarget::Object(oid) => {
                    let mut e = json!({ "name": name, "target": oid.to_string() });
                    if name.starts_with("refs/tags/") {
                        if let Some(peeled) = self.peel_tag(*oid) {
                            e["peeled"] = json!(peeled.to_string());
                        }
                    }
                    e
                }
                RefTarget::Symbolic(to, resolved) => {
                    let mut e = json!({ "name": name, "symref": to });
                    if let Some(id) = resolved {
                        e["target"] = json!(id.to_string());
                    }
                    e
                }
            })
            .collect();
        let mut head = json!({ "name": "HEAD" });
        if let Some(n) = &state.head.0 {
            head["symref"] = json!(n);
        }
        if let Some(id) = &state.head.1 {
            head["target"] = json!(id.to_string());
        }
        json!({ "refs": refs, "head": head })
    }

    /// `getRefs`.
    pub fn refs(&self, prefix: Option<&str>) -> Result<Value, MethodError> {
        Ok(self.refs_json(&self.ref_state(prefix)?))
    }

    /// The first non-tag object an annotated tag leads to; `None` if `oid` is no tag.
    fn peel_tag(&self, mut oid: ObjectId) -> Option<ObjectId> {
        let mut peeled = false;
        for _ in 0..16 {
            if self.kind_of(oid)? != gix::object::Kind::Tag {
                return peeled.then_some(oid);
            }
            let tag = self.repo.find_object(oid).ok()?.try_into_tag().ok()?;
            oid = tag.target_id().ok()?.detach();
            peeled = true;
        }
        None
    }

    fn kind_of(&self, oid: ObjectId) -> Option<gix::object::Kind> {
        self.repo
            .try_find_header(oid)
            .ok()
            .flatten()
            .map(|h| h.kind())
    }

    /// `{objects: [...], truncated?: true}` for `oids` in order; see the crate docs for the
    /// entry shapes and the bounds.
    pub fn objects(&self, oids: &[String]) -> Result<Value, MethodError> {
        if oids.len() > MAX_OIDS {
            return Err(MethodError::invalid(
                format!("at most {MAX_OIDS} oids per call"),
                Some(json!({ "maxOids": MAX_OIDS, "got": oids.len() })),
            ));
        }
        let ids = oids
            .iter()
            .map(|o| parse_oid(o))
            .collect::<Result<Vec<_>, _>>()?;
        let mut objects = Vec::with_capacity(ids.len());
        let mut used: u64 = 0;
        let mut truncated = false;
        for (text, id) in oids.iter().zip(ids) {
            let header = self
                .repo
                .try_find_header(id)
                .map_err(|e| MethodError::internal("reading an object header", e))?;
            let Some(header) = header else {
                objects.push(json!({ "oid": text, "missing": true }));
                continue;
            };
            let (kind, size) = (kind_name(header.kind()), header.size());
            let enc = encoded_len(size);
            if enc > MAX_CONTENT_BYTES as u64 {
                objects.push(json!({ "oid": text, "kind": kind, "size": size, "tooLarge": true }));
                continue;
            }
            if used + enc > MAX_CONTENT_BYTES as u64 {
                truncated = true;
                break;
            }
            let object = self
                .repo
                .try_find_object(id)
                .map_err(|e| MethodError::internal("reading an object", e))?;
            let Some(object) = object else {
                // Gone between header and body (e.g. a concurrent gc).
                objects.push(json!({ "oid": text, "missing": true }));
                continue;
            };
            used += enc;
            let content = base64::engine::general_purpose::STANDARD.encode(&object.data);
            objects.push(json!({
                "oid": text,
                "kind": kind,
                "size": object.data.len(),
                "content": content,
            }));
        }
        let mut result = json!({ "objects": objects });
        if truncated {
            result["truncated"] = json!(true);
        }
        Ok(result)
    }

    /// `{oid, kind, size, offset, content}`: up to `length` (≤ [`MAX_CHUNK_BYTES`]) bytes of one
    /// object from `offset`; `{oid, missing: true}` if absent.
    pub fn chunk(&self, oid: &str, offset: u64, length: Option<u64>) -> Result<Value, MethodError> {
        let id = parse_oid(oid)?;
        let length = length.unwrap_or(MAX_CHUNK_BYTES as u64);
        if length == 0 || length > MAX_CHUNK_BYTES as u64 {
            return Err(MethodError::invalid(
                format!("length must be 1 to {MAX_CHUNK_BYTES}"),
                Some(json!({ "maxLength": MAX_CHUNK_BYTES })),
            ));
        }
        let object = self
            .repo
            .try_find_object(id)
            .map_err(|e| MethodError::internal("reading an object", e))?;
        let Some(object) = object else {
            return Ok(json!({ "oid": oid, "missing": true }));
        };
        let size = object.data.len() as u64;
        let start = offset.min(size) as usize;
        let end = offset.saturating_add(length).min(size) as usize;
        let content = base64::engine::general_purpose::STANDARD.encode(&object.data[start..end]);
        Ok(json!({
            "oid": oid,
            "kind": kind_name(object.kind),
            "size": size,
            "offset": start,
            "content": content,
        }))
    }
}

fn kind_name(kind: gix::object::Kind) -> &'static str {
    match kind {
        gix::object::Kind::Blob => "blob",
        gix::object::Kind::Tree => "tree",
        gix::object::Kind::Commit => "commit",
        gix::object::Kind::Tag => "tag",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_lengths_are_padded_base64() {
        assert_eq!(encoded_len(0), 0);
        assert_eq!(encoded_len(1), 4);
        assert_eq!(encoded_len(3), 4);
        assert_eq!(encoded_len(4), 8);
        assert_eq!(
            encoded_len(MAX_CHUNK_BYTES as u64),
            MAX_CONTENT_BYTES as u64
        );
    }

    #[test]
    fn oids_must_be_full_hex() {
        assert!(parse_oid("0123456789abcdef0123456789abcdef01234567").is_ok());
        for bad in ["", "abc", "z123456789abcdef0123456789abcdef01234567"] {
            let e = parse_oid(bad).err().map(|e| e.code);
            assert_eq!(e, Some(INVALID_PARAMS), "{bad}");
        }
    }
}
