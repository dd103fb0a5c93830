//! Ed25519 signatures over canonical JSON, as AXP reviews carry them: the public key as SPKI
//! PEM, the signature as base64, the signed message the UTF-8 bytes of the value's canonical
//! JSON (`crate::canonical`). Verification is `ring`'s: pure computation, no randomness.
//!
//! Keys are read strictly: one `PUBLIC KEY` PEM block (LF or CRLF line ends, the base64 body
//! on one line or several, line breaks before and after allowed) holding exactly the 44-byte
//! Ed25519 SubjectPublicKeyInfo of RFC 8410 (no algorithm parameters). That is every layout
//! Node, OpenSSL, pyca/cryptography, Go and ed25519-dalek write. Node's `createPublicKey`
//! (what the reference host calls) reads more: text around the block, a second block, a
//! private key (from which it derives the public one); none of those is a public key a
//! client meant to send, so they are refused. A signature may be standard or URL-safe base64,
//! padded or not, as Node's decoder reads both.
//!
//! Test vectors signed by pyca/cryptography (OpenSSL) are in `core/testdata/signature/`.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use ring::signature::{UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::{canonical, hex};

/// A signature as AXP carries it (`{publicKey, signature}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Signature {
    /// SPKI PEM of an Ed25519 public key.
    pub(crate) public_key: String,
    /// Base64 of the 64-byte signature.
    pub(crate) signature: String,
}

/// An Ed25519 public key: its 32 bytes. Two PEM texts of the same key are the same key.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct PublicKey(pub(crate) [u8; 32]);

impl PublicKey {
    /// Lowercase hex of the key's bytes (how the store keeps it).
    pub(crate) fn to_hex(self) -> String {
        hex(&self.0)
    }
}

/// The DER of an Ed25519 SubjectPublicKeyInfo up to the key: SEQUENCE (42 bytes) { SEQUENCE
/// { OID 1.3.101.112 }, BIT STRING (33 bytes, no unused bits) }.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
const BEGIN: &str = "-----BEGIN PUBLIC KEY-----";
const END: &str = "-----END PUBLIC KEY-----";

/// The Ed25519 key in `pem`, if it is one (see the module docs for what is read).
pub(crate) fn read_public_key(pem: &str) -> Option<PublicKey> {
    let pem = pem.trim_matches(['\r', '\n']);
    let mut lines = pem.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    if lines.next()? != BEGIN {
        return None;
    }
    let mut body = String::new();
    let mut ended = false;
    for line in lines {
        if ended {
            // Anything after the block.
            return None;
        }
        if line == END {
            ended = true;
        } else if line.is_empty() || line.contains(['\r', '-']) {
            return None;
        } else {
            body.push_str(line);
        }
    }
    if !ended {
        return None;
    }
    let der = STANDARD.decode(body).ok()?;
    let key = der.strip_prefix(&SPKI_PREFIX[..])?;
    Some(PublicKey(key.try_into().ok()?))
}

/// Reads a signature's base64 (standard or URL-safe, padded or not).
fn read_signature(text: &str) -> Option<Vec<u8>> {
    let lenient =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    GeneralPurpose::new(&alphabet::STANDARD, lenient)
        .decode(text)
        .or_else(|_| GeneralPurpose::new(&alphabet::URL_SAFE, lenient).decode(text))
        .ok()
}

/// The key that signed `value`, if `signed` is a valid Ed25519 signature of its canonical JSON.
pub(crate) fn verify(value: &Value, signed: &Signature) -> Option<PublicKey> {
    let key = read_public_key(&signed.public_key)?;
    let signature = read_signature(&signed.signature)?;
    let message = canonical(value);
    UnparsedPublicKey::new(&ED25519, key.0)
        .verify(message.as_bytes(), &signature)
        .ok()
        .map(|()| key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys Node reads that this host refuses on purpose (see the module docs);
    /// `core/testdata/signature/node_check.mjs` prints exactly these.
    const STRICTER_THAN_NODE: [&str; 3] = [
        "bad key: a private key PEM",
        "bad key: text before the PEM",
        "bad key: two PEM blocks",
    ];

    fn vectors() -> Vec<Value> {
        let file: Value =
            serde_json::from_str(include_str!("../../testdata/signature/vectors.json"))
                .expect("json");
        file["vectors"].as_array().expect("vectors").clone()
    }

    fn signature_of(v: &Value) -> Signature {
        Signature {
            public_key: v["publicKey"].as_str().expect("publicKey").into(),
            signature: v["signature"].as_str().expect("signature").into(),
        }
    }

    #[test]
    fn every_vector_is_judged_as_its_independent_signer_expects() {
        let vectors = vectors();
        assert!(vectors.len() >= 30);
        let (mut good, mut bad) = (0, 0);
        for v in &vectors {
            let name = v["name"].as_str().expect("name");
            assert_eq!(canonical(&v["manifest"]), v["message"], "{name}");
            let valid = v["valid"].as_bool().expect("valid");
            let signed = signature_of(v);
            let got = verify(&v["manifest"], &signed);
            assert_eq!(got.is_some(), valid, "{name}");
            if valid {
                good += 1;
                assert_eq!(got, read_public_key(&signed.public_key), "{name}");
            } else {
                bad += 1;
            }
        }
        assert!(good >= 10 && bad >= 15, "{good} good, {bad} bad");
        let names: Vec<&str> = vectors.iter().filter_map(|v| v["name"].as_str()).collect();
        for name in STRICTER_THAN_NODE {
            assert!(names.contains(&name), "{name}");
        }
    }

    #[test]
    fn every_good_vector_fails_once_tampered() {
        for v in vectors().iter().filter(|v| v["valid"] == true) {
            let name = v["name"].as_str().expect("name");
            let signed = signature_of(v);
            // Another message.
            let mut m = v["manifest"].clone();
            m["traceThroughSeq"] = serde_json::json!(0);
            assert!(verify(&m, &signed).is_none(), "{name}");
            // Each byte of the signature, one bit flipped.
            let raw = read_signature(&signed.signature).expect("base64");
            for i in 0..raw.len() {
                let mut flipped = raw.clone();
                flipped[i] ^= 0x10;
                let bad = Signature {
                    signature: STANDARD.encode(&flipped),
                    ..signed.clone()
                };
                assert!(verify(&v["manifest"], &bad).is_none(), "{name} byte {i}");
            }
        }
    }

    #[test]
    fn one_key_in_two_layouts_is_one_key() {
        let v = &vectors()[0];
        let pem = v["publicKey"].as_str().expect("pem");
        let key = read_public_key(pem).expect("key");
        assert_eq!(read_public_key(&pem.replace('\n', "\r\n")), Some(key));
        assert_eq!(read_public_key(&format!("\n\n{pem}\n")), Some(key));
        assert_eq!(key.to_hex().len(), 64);
        for bad in [
            "",
            BEGIN,
            &format!("{BEGIN}\n{END}\n"),
            &pem.replace('\n', " "),
            &pem.replace('\n', "\r"),
            &format!(" {pem}"),
            &pem.replacen("\n", "\n\n", 1),
        ] {
            assert_eq!(read_public_key(bad), None, "{bad:?}");
        }
    }
}
