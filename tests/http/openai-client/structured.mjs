// Structured output through the official `openai` npm client against an
// engine-host whose engine takes the allowed-token mask (cpu-reference):
// json_schema (streamed and not) and json_object outputs parse and match,
// and an unsupported schema keyword is a 400 the client reports.
// Usage: node structured.mjs http://127.0.0.1:PORT   (exit 0 = every check passed)
import OpenAI from "openai";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };
const check = (cond, msg) => { if (!cond) fail(msg); };
const model = (await client.models.list()).data[0].id;

const schema = {
  type: "object",
  properties: {
    animal: { type: "string", enum: ["cat", "dog", "owl"] },
    legs: { type: "integer" },
    happy: { type: "boolean" },
  },
  required: ["animal", "legs", "happy"],
  additionalProperties: false,
};
const response_format = { type: "json_schema", json_schema: { name: "animal", strict: true, schema } };
const messages = [{ role: "user", content: "An animal, as JSON." }];
const valid = (v) => v && ["cat", "dog", "owl"].includes(v.animal) && Number.isInteger(v.legs) &&
  typeof v.happy === "boolean" && Object.keys(v).length === 3;

for (const seed of [1, 2, 3]) {
  const r = await client.chat.completions.create({ model, messages, response_format, temperature: 1, seed, max_tokens: 200 });
  const content = r.choices[0].message.content;
  check(r.choices[0].finish_reason === "stop", `finish_reason stop, got ${r.choices[0].finish_reason}: ${content}`);
  let v;
  try { v = JSON.parse(content); } catch (e) { fail(`not JSON: ${content}`); }
  check(valid(v), `does not match the schema: ${content}`);
}

// Streamed: the deltas join into the same kind of document.
const stream = await client.chat.completions.create({ model, messages, response_format, temperature: 0, seed: 4,
  max_tokens: 200, stream: true });
let text = "";
for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
check(valid(JSON.parse(text)), `streamed output does not match: ${text}`);

// json_object: an object.
const obj = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 200, temperature: 0,
  response_format: { type: "json_object" } });
if (obj.choices[0].finish_reason === "stop") check(typeof JSON.parse(obj.choices[0].text) === "object", "json_object");

// An unsupported keyword: a 400 naming it.
try {
  await client.chat.completions.create({ model, messages, response_format: { type: "json_schema",
    json_schema: { name: "x", schema: { type: "object", properties: { z: { type: "array", contains: { type: "integer" }, minContains: 2 } } } } } });
  fail("a schema with 'minContains' was accepted");
} catch (e) {
  check(e.status === 400, `status 400, got ${e.status}`);
  check(String(e.message).includes("'minContains'"), `the error names the keyword: ${e.message}`);
}
console.log(JSON.stringify({ ok: true }));
