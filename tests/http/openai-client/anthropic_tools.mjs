// Tool use through the official `@anthropic-ai/sdk` npm client: a served
// model whose output is some text and one get_weather call (the test engine,
// scripted), read whole, streamed through the SDK's MessageStream (which
// assembles tool_use input from input_json_delta events), then the call and
// its result sent back as history.
// Usage: node anthropic_tools.mjs http://127.0.0.1:PORT   (exit 0 = every check passed)
import Anthropic from "@anthropic-ai/sdk";

const base = process.argv[2];
const client = new Anthropic({ baseURL: base, apiKey: "unused", maxRetries: 0 });
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };
const check = (cond, msg) => { if (!cond) fail(msg); };

const tools = [{
  name: "get_weather", description: "Weather now",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
}];
const request = {
  model: "claude-test", max_tokens: 200, tools, tool_choice: { type: "auto" },
  messages: [{ role: "user", content: "Weather in Paris?" }],
};

// Whole.
const msg = await client.messages.create(request);
check(msg.stop_reason === "tool_use", `stop_reason tool_use, got ${msg.stop_reason}`);
const use = msg.content.find((b) => b.type === "tool_use");
check(use && use.name === "get_weather" && use.input.city === "Paris", `a tool_use block, got ${JSON.stringify(msg.content)}`);
check(/^toolu_[A-Za-z0-9]{24}$/.test(use.id), `tool_use id ${use.id}`);
check(msg.content[0].type === "text" && msg.content[0].text.includes("Checking."), "the text before the call");

// Streamed through the SDK's helper: the same blocks, input assembled from
// the input_json_delta pieces.
const stream = client.messages.stream(request);
let pieces = 0;
stream.on("inputJson", () => { pieces++; });
const final = await stream.finalMessage();
const streamed = final.content.find((b) => b.type === "tool_use");
check(final.stop_reason === "tool_use", `streamed stop_reason ${final.stop_reason}`);
check(streamed && JSON.stringify(streamed.input) === JSON.stringify(use.input),
      `streamed input ${JSON.stringify(streamed?.input)} vs ${JSON.stringify(use.input)}`);
check(pieces > 1, `input arrived in several input_json_delta pieces (${pieces})`);

// The call and its result as history.
const next = await client.messages.create({
  ...request, max_tokens: 5,
  messages: [...request.messages, { role: "assistant", content: msg.content },
             { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny, 21 C" }] }],
});
check(next.type === "message", "history with a tool_result is accepted");

// A tool_choice naming an unknown tool is a typed 400.
try {
  await client.messages.create({ ...request, tool_choice: { type: "tool", name: "nope" } });
  fail("unknown tool_choice name accepted");
} catch (e) {
  check(e instanceof Anthropic.BadRequestError, `BadRequestError, got ${e.constructor.name}`);
}
console.log(JSON.stringify({ ok: true, use, pieces }));
