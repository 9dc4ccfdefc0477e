// Drives an engine-host started with --embedding through the official
// `openai` npm client's embeddings.create.
// Usage: node embeddings.mjs http://127.0.0.1:PORT   (exit 0 = every check passed)
import OpenAI from "openai";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };
const check = (cond, msg) => { if (!cond) fail(msg); };
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

const model = (await client.models.list()).data[0].id;

// The client asks for base64 unless told otherwise and decodes it itself.
const one = await client.embeddings.create({ model, input: "the quick brown fox" });
check(one.object === "list", "object list");
check(one.data.length === 1 && one.data[0].object === "embedding" && one.data[0].index === 0, "one embedding");
const v = one.data[0].embedding;
check(Array.isArray(v) && v.length === 8, `8 dimensions, got ${v.length}`);
check(Math.abs(norm(v) - 1) < 1e-5, `unit length, got ${norm(v)}`);
check(one.usage.prompt_tokens > 0 && one.usage.total_tokens === one.usage.prompt_tokens, "usage");

// Floats asked for: the same vector.
const f = await client.embeddings.create({ model, input: "the quick brown fox", encoding_format: "float" });
check(f.data[0].embedding.every((x, i) => Math.abs(x - v[i]) < 1e-7), "float equals decoded base64");

// Several inputs at once, in order, each as when sent alone.
const many = await client.embeddings.create({ model, input: ["a", "the quick brown fox", "b"] });
check(many.data.length === 3 && many.data.map((d) => d.index).join() === "0,1,2", "three in order");
check(many.data[1].embedding.every((x, i) => x === v[i]), "batched input equals the one sent alone");

// Token ids are input too.
const ids = await client.embeddings.create({ model, input: [[1, 450, 4996], [1, 263]] });
check(ids.data.length === 2, "token-id inputs");

// Text generation is refused on an embedding server: a 400 the client raises.
try {
  await client.completions.create({ model, prompt: "hi", max_tokens: 2 });
  fail("completions on an embedding server succeeded");
} catch (e) {
  check(e.status === 400, `completions refused with 400, got ${e.status}`);
}
console.log(JSON.stringify({ ok: true }));
