//! Review signatures: each principal's Ed25519 key (from its id, so a reconnected or restarted
//! actor signs with the same key, which the host binds to it for good) and the manifest of a
//! session's checkpoint, built from an export as the reference's SDK builds it.

use axhost_core::canonical::{canonical, hash_object};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Actor;

/// The SubjectPublicKeyInfo DER of an Ed25519 key up to the key's 32 bytes (RFC 8410).
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Actor {
    /// `{publicKey, signature}` of this principal over the canonical JSON of `manifest`.
    pub(super) fn sign(&self, manifest: &Value) -> Value {
        sign_as(&self.principal.id, manifest)
    }
}

/// `{publicKey, signature}` of `principal`'s key over the canonical JSON of `manifest`.
/// Ed25519 is deterministic, so the oracle can tell which manifest a signature is of.
pub(crate) fn sign_as(principal: &str, manifest: &Value) -> Value {
    let seed: [u8; 32] = Sha256::digest(principal.as_bytes()).into();
    let Ok(key) = Ed25519KeyPair::from_seed_unchecked(&seed) else {
        return json!({"publicKey": "", "signature": ""});
    };
    let mut der = SPKI_PREFIX.to_vec();
    der.extend_from_slice(key.public_key().as_ref());
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64(&der)
    );
    let signature = key.sign(canonical(manifest).as_bytes());
    json!({"publicKey": pem, "signature": base64(signature.as_ref())})
}

/// The manifest of the checkpoint `archive` (an `_axp/export` answer) shows, with the trace
/// through its `serverSeq`; `None` without a checkpoint.
pub(super) fn manifest(archive: &Value) -> Option<Value> {
    let state = &archive["snapshots"][0]["state"];
    let checkpoint = &state["checkpoint"];
    if !checkpoint.is_object() {
        return None;
    }
    let changeset = state["session"]
        .as_str()?
        .replacen("ahp-session:", "ahp-changeset:", 1);
    let trace: Vec<Value> = archive["actions"]
        .as_array()?
        .iter()
        .filter(|e| e["channel"] != changeset.as_str())
        .cloned()
        .collect();
    Some(json!({
        "version": 1, "repository": state["repository"], "session": state["session"],
        "baseCommit": checkpoint["baseCommit"], "headCommit": checkpoint["headCommit"],
        "model": "sim-model", "promptHash": hash_object(&json!("sim prompt")),
        "traceHash": hash_object(&Value::Array(trace)),
        "traceThroughSeq": archive["serverSeq"],
        "checkpointDigest": hash_object(checkpoint),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_pads_as_the_standard_does() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foob"), "Zm9vYg==");
    }
}
