// Canonical JSON vectors from JavaScript itself, independent of the host's Rust code.
//
// Each input is JSON text, as a client would send it. JavaScript parses it (JSON.parse) and
// writes it canonically: object keys sorted by Array.prototype.sort (UTF-16 code units), every
// other value as JSON.stringify writes it. The SHA-256 is of the canonical text's UTF-8 bytes.
// An input JavaScript cannot write canonically (a number beyond a double) records its error.
//
// Regenerate: node core/testdata/canonical/vectors.mjs > core/testdata/canonical/vectors.json
import { createHash } from "node:crypto";

function canonicalText(value) {
  if (Array.isArray(value)) return "[" + value.map(canonicalText).join(",") + "]";
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort();
    return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonicalText(value[k])).join(",") + "}";
  }
  if (typeof value === "number" && !Number.isFinite(value))
    throw new Error("not a finite number");
  return JSON.stringify(value);
}

// [name, JSON text]. String.raw keeps escapes as the wire carries them.
const inputs = [
  ["empty object", "{}"],
  ["empty array", "[]"],
  ["literals", "[null,true,false]"],
  ["nested keys sort at every depth", '{"b":1,"a":{"d":[1,{"f":2,"e":3}],"c":"x"}}'],
  ["arrays keep their order", '[3,1,2,{"b":0,"a":0}]'],
  ["uppercase sorts before lowercase", '{"b":1,"B":2,"a":3,"A":4,"_":5,"0":6}'],
  ["the empty key sorts first", '{"a":1,"":2," ":3}'],
  ["a prefix sorts before its extensions", '{"ab":1,"a":2,"abc":3,"aa":4}'],
  ["integer-like keys sort as strings", '{"10":1,"9":2,"1":3,"a":4,"01":5}'],
  ["non-BMP key before a high BMP key", String.raw`{"\uff61":1,"\ud83d\ude00":2,"\u00e9":3,"z":4}`],
  ["keys differing past a surrogate pair", String.raw`{"\ud83d\ude01":1,"\ud83d\ude00":2,"\ud83c\udf00":3}`],
  ["private-use BMP key against astral key", String.raw`{"\ue000":1,"\ud800\udc00":2,"\uffff":3}`],
  ["duplicate keys: the last wins", '{"a":1,"b":2,"a":3}'],
  ["a __proto__ key is plain data", '{"__proto__":{"x":1},"a":0}'],
  ["control characters", String.raw`"\u0000\u0001\u0007\b\t\n\u000b\f\r\u001f"`],
  ["quote, backslash and solidus", String.raw`"a\"b\\c\/d/"`],
  ["DEL and C1 controls pass through", String.raw`"\u007f\u0080\u009f"`],
  ["line and paragraph separators pass through", String.raw`"\u2028\u2029"`],
  ["escaped BMP text decodes", String.raw`"\u00e9\u4e2d\uffff"`],
  ["a surrogate pair written as escapes", String.raw`"\ud83d\ude00"`],
  ["raw non-BMP text", '"😀𝄞"'],
  ["a lone high surrogate", String.raw`"\ud800"`],
  ["a lone low surrogate", String.raw`"\udc00"`],
  ["a lone surrogate in a key", String.raw`{"\udbff":1}`],
  ["integers", "[0,1,-1,42,-0,9007199254740991,-9007199254740991]"],
  ["integers past 2^53 round to doubles", "[9007199254740992,9007199254740993,-9007199254740993,12345678901234567890]"],
  ["u64 and i64 extremes", "[18446744073709551615,18446744073709551616,-9223372036854775808,-9223372036854775809]"],
  ["a long integer", "[123456789012345678901234567890]"],
  ["fractions that are integers", "[100.0,1.0,-2.000,1e2,1E2,0.1e1,-0.0]"],
  ["simple fractions", "[0.5,-0.25,1.5,4.35,0.1,0.30000000000000004]"],
  ["exponent thresholds above", "[1e20,1e21,1.5e21,123456789012345680000,999999999999999999999]"],
  ["exponent thresholds below", "[0.000001,1e-6,1e-7,0.0000001234,1.2345e-10,-1e-7]"],
  ["extreme doubles", "[1.7976931348623157e308,5e-324,2.2250738585072014e-308,4.9406564584124654e-324]"],
  ["hard-to-round decimals", "[2.2250738585072011e-308,7.038531e-26,9007199254740993.0,1.00000000000000011102230246251565404236316680908203125]"],
  ["more hard-to-round decimals", "[0.1000000000000000055511151231257827,8.41e21,5.8e-323,1.448997445238699,89255.0e-22]"],
  ["shortest round-trip digits", "[0.1,0.2,0.7,1.1,123.456,1e23,5e-7,3.14159]"],
  ["a number beyond a double", "[1e400]"],
  ["whitespace between tokens is dropped", ' { "a" : [ 1 , 2 ] ,\n\t"b" : null } '],
  ["a manifest-like object", '{"version":1,"repository":"r","session":"ahp-session:/s1","baseCommit":"' + "a".repeat(40) + '","headCommit":"' + "b".repeat(40) + '","model":"m","promptHash":"' + "c".repeat(64) + '","traceHash":"' + "d".repeat(64) + '","traceThroughSeq":17,"checkpointDigest":"' + "e".repeat(64) + '"}'],
  ["an envelope with origin", '{"channel":"ahp-chat:/s1","action":{"type":"chat/turnStarted","turnId":"t1","userMessage":{"text":"héllo 😀"}},"serverSeq":12,"origin":{"clientId":"c1","clientSeq":3}}'],
  ["deep nesting", "[".repeat(40) + '{"z":1,"y":[{"b":2,"a":1}]}' + "]".repeat(40)],
];

const vectors = inputs.map(([name, input]) => {
  const value = JSON.parse(input);
  try {
    const canonical = canonicalText(value);
    const sha256 = createHash("sha256").update(canonical, "utf8").digest("hex");
    return { name, input, canonical, sha256 };
  } catch (error) {
    return { name, input, error: error.message };
  }
});

process.stdout.write(JSON.stringify({ generator: `node ${process.version}`, vectors }, null, 1) + "\n");
