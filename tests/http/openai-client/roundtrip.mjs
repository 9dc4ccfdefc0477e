// Drives engine-host through the official `openai` npm client.
// Usage: node roundtrip.mjs http://127.0.0.1:PORT   (exit 0 = every check passed)
import OpenAI from "openai";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };
const check = (cond, msg) => { if (!cond) fail(msg); };

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id, "models.list returns the served model");
const model = models.data[0].id;

// Chat, not streaming.
const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 8, temperature: 0, seed: 3,
});
check(chat.object === "chat.completion", "chat object");
check(chat.choices[0].message.role === "assistant", "assistant role");
check(typeof chat.choices[0].message.content === "string", "content is text");
check(chat.choices[0].finish_reason === "length", `finish_reason length, got ${chat.choices[0].finish_reason}`);
check(chat.usage.completion_tokens === 8, "usage.completion_tokens");

// Chat, streaming, with usage: the same greedy text arrives in pieces.
const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 8, temperature: 0, seed: 3,
  stream: true, stream_options: { include_usage: true },
});
let text = "", finish = null, usage = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta?.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(chunks > 2, "several chunks");
check(text === chat.choices[0].message.content, `streamed text equals non-streamed (${JSON.stringify(text)} vs ${JSON.stringify(chat.choices[0].message.content)})`);
check(finish === "length", "streamed finish_reason");
check(usage && usage.completion_tokens === 8 && usage.total_tokens === usage.prompt_tokens + 8, "streamed usage");

// Legacy completions, both ways.
const comp = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, temperature: 0 });
check(comp.object === "text_completion" && typeof comp.choices[0].text === "string", "completion");
let ctext = "";
for await (const chunk of await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, temperature: 0, stream: true }))
  ctext += chunk.choices[0]?.text ?? "";
check(ctext === comp.choices[0].text, "streamed completion equals non-streamed");

// Errors surface as APIError with the status.
try {
  await client.chat.completions.create({ model, messages: [{ role: "user", content: "x" }], max_tokens: 0 });
  fail("max_tokens 0 accepted");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 400, `400 APIError, got ${e}`);
}
console.log(JSON.stringify({ ok: true, text }));
