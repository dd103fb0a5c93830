"""Ed25519 vectors for AXP review signatures, made with pyca/cryptography (OpenSSL), independent
of the host's Rust code.

A signature is Ed25519 over the UTF-8 bytes of a manifest's canonical JSON (keys sorted, no
spaces); the public key travels as SPKI PEM, the signature as base64. Keys come from fixed
seeds, so the output is the same on every run. Each vector says whether a verifier must accept
it; the script checks every expectation it can against OpenSSL before printing.

Regenerate: python3 core/testdata/signature/vectors.py > core/testdata/signature/vectors.json
"""
import base64
import copy
import hashlib
import json
import sys

import cryptography
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

# The order of the Ed25519 group: S + L is the same scalar, written non-canonically.
L = 2**252 + 27742317777372353535851937790883648493


def key(n):
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(f"axhost review key {n}".encode()).digest())


def pem(private):
    return private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def canonical(value):
    # Manifests hold strings and small integers; for those, sorted keys and compact separators
    # are JavaScript's canonical JSON (keys here are ASCII, so code points order as UTF-16 units).
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def b64(raw):
    return base64.b64encode(raw).decode()


def manifest(n, **changes):
    m = {
        "version": 1,
        "repository": "github.com/example/repo",
        "session": f"ahp-session:/s{n}",
        "baseCommit": hashlib.sha1(f"base {n}".encode()).hexdigest(),
        "headCommit": hashlib.sha1(f"head {n}".encode()).hexdigest(),
        "model": "model-x",
        "promptHash": hashlib.sha256(f"prompt {n}".encode()).hexdigest(),
        "traceHash": hashlib.sha256(f"trace {n}".encode()).hexdigest(),
        "traceThroughSeq": 10 * n + 7,
        "checkpointDigest": hashlib.sha256(f"checkpoint {n}".encode()).hexdigest(),
    }
    m.update(changes)
    return m


def openssl_accepts(public_pem, message, signature_b64):
    try:
        public = serialization.load_pem_public_key(public_pem.encode())
        if not isinstance(public, Ed25519PublicKey):
            return False
        public.verify(base64.b64decode(signature_b64 + "=" * (-len(signature_b64) % 4), altchars=b"-_"), message.encode())
        return True
    except (InvalidSignature, ValueError, TypeError, cryptography.exceptions.UnsupportedAlgorithm):
        return False


vectors = []


def add(name, public_key, m, signature, valid, openssl_agrees=True):
    message = canonical(m)
    if openssl_agrees:
        assert openssl_accepts(public_key, message, signature) == valid, name
    vectors.append(
        {
            "name": name,
            "manifest": m,
            "message": message,
            "publicKey": public_key,
            "signature": signature,
            "valid": valid,
        }
    )


def sign(private, m):
    return b64(private.sign(canonical(m).encode()))


# Good signatures: several keys and manifests, a non-ASCII model, the largest sequence number.
for n in range(6):
    k = key(n)
    m = manifest(n)
    add(f"good {n}", pem(k), m, sign(k, m), True)
k = key(6)
m = manifest(6, model="modèle 😀 \"quoted\" \\ tab\t")
add("good: non-ASCII and escaped text in the manifest", pem(k), m, sign(k, m), True)
m = manifest(7, traceThroughSeq=2**53 - 1)
add("good: the largest traceThroughSeq", pem(k), m, sign(k, m), True)

# PEM layouts seen in practice: CRLF line ends, no final line break, the body split over lines.
k = key(8)
m = manifest(8)
s = sign(k, m)
p = pem(k)
add("good: CRLF line ends", p.replace("\n", "\r\n"), m, s, True)
add("good: no final line break", p.rstrip("\n"), m, s, True)
lines = p.splitlines()
body = lines[1]
split = "\n".join([lines[0], body[:30], body[30:], lines[2]]) + "\n"
add("good: the base64 body split over two lines", split, m, s, True)
add("good: a signature without base64 padding", p, m, s.rstrip("="), True)

# Tampered: the host must refuse every one.
k = key(9)
m = manifest(9)
s = sign(k, m)
raw = bytearray(base64.b64decode(s))
for i, bit in [(0, 0), (31, 7), (32, 0), (63, 6)]:
    flipped = bytearray(raw)
    flipped[i] ^= 1 << bit
    add(f"tampered: signature byte {i} bit {bit}", pem(k), m, b64(bytes(flipped)), False)
add("tampered: traceThroughSeq changed", pem(k), manifest(9, traceThroughSeq=manifest(9)["traceThroughSeq"] + 1), s, False)
add("tampered: headCommit changed", pem(k), manifest(9, headCommit="0" * 40), s, False)
other = key(10)
add("tampered: another key", pem(other), m, s, False)
add("tampered: signed by another key", pem(k), m, sign(other, m), False)
add("tampered: a signature one byte short", pem(k), m, b64(bytes(raw[:63])), False)
add("tampered: a signature one byte long", pem(k), m, b64(bytes(raw) + b"\0"), False)
add("tampered: an empty signature", pem(k), m, "", False)
s_int = int.from_bytes(raw[32:], "little")
non_canonical = bytes(raw[:32]) + (s_int + L).to_bytes(32, "little")
add("tampered: S + L (a non-canonical scalar)", pem(k), m, b64(non_canonical), False)
reordered = copy.deepcopy(m)
add("good: key order in the manifest does not matter", pem(k), dict(reversed(list(reordered.items()))), s, True)

# Keys the host refuses to read (OpenSSL reads some of these; the host is strict on purpose).
x = X25519PrivateKey.from_private_bytes(hashlib.sha256(b"x25519").digest())
x_pem = x.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
add("bad key: an X25519 key", x_pem, m, s, False)
private_pem = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
add("bad key: a private key PEM", private_pem, m, s, False, openssl_agrees=False)
add("bad key: the raw key in base64", b64(k.public_key().public_bytes_raw()), m, s, False)
add("bad key: text before the PEM", "key:\n" + pem(k), m, s, False, openssl_agrees=False)
add("bad key: two PEM blocks", pem(k) + pem(k), m, s, False, openssl_agrees=False)
add("bad key: wrong label", pem(k).replace("PUBLIC KEY", "PRIVATE KEY"), m, s, False)
der = base64.b64decode(pem(k).splitlines()[1])
with_null = bytes([0x30, 0x2C, 0x30, 0x07, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x05, 0x00]) + der[11:]
null_pem = "-----BEGIN PUBLIC KEY-----\n" + b64(with_null) + "\n-----END PUBLIC KEY-----\n"
add("bad key: algorithm parameters present", null_pem, m, s, False, openssl_agrees=False)
short = bytes([0x30, 0x29]) + der[2:11] + bytes([0x20]) + der[12:-1]
short_pem = "-----BEGIN PUBLIC KEY-----\n" + b64(short) + "\n-----END PUBLIC KEY-----\n"
add("bad key: a 31-byte key", short_pem, m, s, False)

json.dump(
    {"generator": f"python {sys.version.split()[0]}, cryptography {cryptography.__version__}", "vectors": vectors},
    sys.stdout,
    indent=1,
    ensure_ascii=False,
)
sys.stdout.write("\n")
