// Drives engine-host's Responses API through the official `openai` npm
// client (the server runs with --api-key KEY): responses.create whole and
// streamed (raw events and the SDK's ResponseStream helper), retrieve,
// previous_response_id, del, and the SDK's typed errors.
// Usage: node responses.mjs http://127.0.0.1:PORT KEY   (exit 0 = every check passed)
import OpenAI from "openai";

const [base, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };
const check = (cond, msg) => { if (!cond) fail(msg); };
const request = {
  model: "test-model", instructions: "You tell short stories.", input: "Once upon a time",
  max_output_tokens: 12, temperature: 0,
};

// Not streamed.
const resp = await client.responses.create(request);
check(resp.object === "response" && /^resp_[0-9a-f]{32}$/.test(resp.id), `a response, got ${resp.object} ${resp.id}`);
check(resp.status === "incomplete" && resp.incomplete_details?.reason === "max_output_tokens",
      `status ${resp.status} ${JSON.stringify(resp.incomplete_details)}`);
check(resp.output.length === 1 && resp.output[0].type === "message", `one message item: ${JSON.stringify(resp.output)}`);
check(resp.output_text.length > 0, "the SDK's output_text");
check(resp.usage.output_tokens === 12 && resp.usage.input_tokens > 0 &&
      resp.usage.total_tokens === resp.usage.input_tokens + 12, `usage ${JSON.stringify(resp.usage)}`);
check(resp.instructions === request.instructions && resp.max_output_tokens === 12, "the request's settings echoed");

// Streamed through the SDK's ResponseStream helper, which assembles the
// output from the item, part and delta events: same text. (This client
// version takes the final response from response.completed only, so a
// response cut by max_output_tokens keeps its assembled snapshot.)
const stream = client.responses.stream(request);
let deltas = 0;
stream.on("response.output_text.delta", () => { deltas++; });
const final = await stream.finalResponse();
const text = final.output.filter((i) => i.type === "message").flatMap((i) => i.content).map((p) => p.text).join("");
check(deltas > 2, `several text deltas (${deltas})`);
check(text === resp.output_text, `streamed text equals non-streamed (${JSON.stringify(text)} vs ${JSON.stringify(resp.output_text)})`);

// Raw events: the documented order, sequence numbers counting from 0.
const raw = await client.responses.create({ ...request, stream: true });
const kinds = [];
let seq = 0;
let last;
for await (const ev of raw) {
  kinds.push(ev.type);
  check(ev.sequence_number === seq++, `sequence_number ${ev.sequence_number} at ${seq - 1}`);
  last = ev;
}
check(last.response.status === "incomplete" && last.response.usage.output_tokens === 12, "streamed status and usage");
const want = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"];
check(want.every((k, i) => kinds[i] === k), `event order ${kinds.join(",")}`);
check(kinds.slice(-4).join(",") ===
      "response.output_text.done,response.content_part.done,response.output_item.done,response.incomplete",
      `event order ${kinds.join(",")}`);

// Stored: retrieve it, continue from it, delete it.
const got = await client.responses.retrieve(resp.id);
check(got.id === resp.id && JSON.stringify(got.output) === JSON.stringify(resp.output), "retrieve returns the stored response");
const next = await client.responses.create({ ...request, previous_response_id: resp.id, input: "And then?", max_output_tokens: 4 });
check(next.previous_response_id === resp.id, "previous_response_id echoed");
check(next.usage.input_tokens > resp.usage.input_tokens + 6, `the earlier turn is in the prompt (${next.usage.input_tokens})`);
await client.responses.del(resp.id);
try {
  await client.responses.retrieve(resp.id);
  fail("a deleted response retrieved");
} catch (e) {
  check(e instanceof OpenAI.NotFoundError, `NotFoundError, got ${e.constructor.name}`);
}

// Errors arrive as the SDK's typed errors, naming the field.
try {
  await client.responses.create({ ...request, previous_response_id: resp.id });
  fail("a deleted previous_response_id accepted");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.param === "previous_response_id", `BadRequestError, got ${e.constructor.name} ${e.param}`);
}
try {
  await client.responses.create({ ...request, tools: [{ type: "web_search_preview" }] });
  fail("a built-in tool accepted");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.param === "tools", `BadRequestError on tools, got ${e.constructor.name} ${e.param}`);
}
try {
  await new OpenAI({ baseURL: `${base}/v1`, apiKey: key + "-wrong", maxRetries: 0 }).responses.create(request);
  fail("a wrong key accepted");
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError, `AuthenticationError, got ${e.constructor.name}`);
}
console.log(JSON.stringify({ ok: true, text: resp.output_text, deltas }));
