// Drives engine-host's Anthropic Messages API through the official
// `@anthropic-ai/sdk` npm client (the server runs with --api-key KEY).
// Usage: node anthropic.mjs http://127.0.0.1:PORT KEY   (exit 0 = every check passed)
import Anthropic from "@anthropic-ai/sdk";

const [base, key] = process.argv.slice(2);
const client = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };
const check = (cond, msg) => { if (!cond) fail(msg); };
const request = {
  model: "claude-test", max_tokens: 12, temperature: 0, system: "You tell short stories.",
  messages: [{ role: "user", content: "Once upon a time" }],
};

// Not streamed.
const msg = await client.messages.create(request);
check(msg.type === "message" && msg.role === "assistant", "a message from the assistant");
check(msg.id.startsWith("msg_"), `id ${msg.id}`);
check(msg.content.length === 1 && msg.content[0].type === "text" && msg.content[0].text.length > 0, "one text block");
check(msg.stop_reason === "max_tokens", `stop_reason ${msg.stop_reason}`);
check(msg.usage.output_tokens === 12 && msg.usage.input_tokens > 0, "usage");

// Streamed through the SDK's accumulating helper: same text, same usage.
const stream = client.messages.stream(request);
let deltas = 0;
stream.on("text", () => { deltas++; });
const final = await stream.finalMessage();
check(deltas > 2, `several text deltas (${deltas})`);
check(final.content[0].text === msg.content[0].text,
      `streamed text equals non-streamed (${JSON.stringify(final.content[0].text)} vs ${JSON.stringify(msg.content[0].text)})`);
check(final.stop_reason === "max_tokens" && final.usage.output_tokens === 12, "streamed stop_reason and usage");

// Raw stream events.
const raw = await client.messages.create({ ...request, stream: true });
const kinds = [];
for await (const ev of raw) kinds.push(ev.type);
check(kinds[0] === "message_start" && kinds.at(-1) === "message_stop", `event order ${kinds.join(",")}`);

// Token count.
const { system, messages, model } = request;
const count = await client.messages.countTokens({ model, system, messages });
check(count.input_tokens === msg.usage.input_tokens, `count_tokens ${count.input_tokens} vs ${msg.usage.input_tokens}`);

// Errors arrive as the SDK's typed errors.
try {
  await client.messages.create({ ...request, max_tokens: 0 });
  fail("max_tokens 0 accepted");
} catch (e) {
  check(e instanceof Anthropic.BadRequestError, `BadRequestError, got ${e.constructor.name}`);
  check(e.error?.error?.type === "invalid_request_error", `error type ${JSON.stringify(e.error)}`);
}
try {
  await new Anthropic({ baseURL: base, apiKey: key + "-wrong", maxRetries: 0 }).messages.create(request);
  fail("a wrong key accepted");
} catch (e) {
  check(e instanceof Anthropic.AuthenticationError, `AuthenticationError, got ${e.constructor.name}`);
}
console.log(JSON.stringify({ ok: true, text: msg.content[0].text, deltas }));
