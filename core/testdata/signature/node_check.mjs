// Runs the signature vectors through Node's own Ed25519 (what the reference host calls) and
// prints every vector on which Node's verdict differs from the expected one. Expected output:
// the three keys the host refuses on purpose although Node reads them (a private key PEM,
// text before the PEM, two PEM blocks).
//
// Run: node core/testdata/signature/node_check.mjs core/testdata/signature/vectors.json
import { createPublicKey, verify } from "node:crypto";
import { readFileSync } from "node:fs";
const d = JSON.parse(readFileSync(process.argv[2], "utf8"));
function canonicalText(value) {
  if (Array.isArray(value)) return "[" + value.map(canonicalText).join(",") + "]";
  if (value !== null && typeof value === "object") return "{" + Object.keys(value).sort().map((k) => JSON.stringify(k) + ":" + canonicalText(value[k])).join(",") + "}";
  return JSON.stringify(value);
}
for (const v of d.vectors) {
  let ok;
  try { const key = createPublicKey(v.publicKey); ok = key.asymmetricKeyType === "ed25519" && verify(null, Buffer.from(canonicalText(v.manifest)), key, Buffer.from(v.signature, "base64")); } catch { ok = false; }
  if (canonicalText(v.manifest) !== v.message) console.log("MESSAGE DIFFERS", v.name);
  if (ok !== v.valid) console.log("node says", ok, "for", v.name);
}
