// Independent check of axhost's lesson ids (core/src/axp/memory/entry.rs): the AXP reference
// computes a lesson's id as SHA-256 hex of the canonical JSON of
// {scope, title, trigger, lesson, outcome}: keys sorted as JavaScript sorts them, then
// JSON.stringify. Run: node core/testdata/memory_id.mjs > core/testdata/memory_id.json
import { createHash } from "node:crypto";

function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value && typeof value === "object")
    return `{${Object.keys(value)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`)
      .join(",")}}`;
  return JSON.stringify(value);
}

const lessons = [
  ["default", "Parser API", "parser edits", "Preserve the public return types", "failure"],
  ["acme/widgets", "Retry uploads", "flaky network during upload", "Back off exponentially, cap at 30 s.", "success"],
  ["repo", "Ünïcödé façade", "日本語のテスト 😀", "Quotes \" and \\ backslashes,\nnew lines\tand \u0001 controls", "failure"],
  ["r", "a", "b", "c", "success"],
];

const out = lessons.map(([scope, title, trigger, lesson, outcome]) => {
  const content = { scope, title, trigger, lesson, outcome };
  const id = createHash("sha256").update(canonical(content)).digest("hex");
  return { ...content, id };
});
console.log(JSON.stringify(out, null, 2));
