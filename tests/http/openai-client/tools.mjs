// Tool calling through the official `openai` npm client: a served model
// whose output is one get_weather call (the test engine, scripted), read
// whole, streamed chunk by chunk, and assembled by the client's own stream
// helper (which checks OpenAI's delta rules as it merges); then the call and
// its result sent back as history.
// Usage: node tools.mjs http://127.0.0.1:PORT   (exit 0 = every check passed)
import OpenAI from "openai";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };
const check = (cond, msg) => { if (!cond) fail(msg); };

const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "Weather now",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];
const messages = [{ role: "user", content: "Weather in Paris?" }];
const model = (await client.models.list()).data[0].id;

// Whole.
const whole = await client.chat.completions.create({ model, messages, tools, tool_choice: "auto", max_tokens: 200 });
const msg = whole.choices[0].message;
check(whole.choices[0].finish_reason === "tool_calls", `finish_reason tool_calls, got ${whole.choices[0].finish_reason}`);
check(msg.tool_calls?.length === 1, `one tool call, got ${JSON.stringify(msg)}`);
const call = msg.tool_calls[0];
check(call.type === "function" && call.function.name === "get_weather", "call name");
check(/^call_[A-Za-z0-9]{24}$/.test(call.id), `call id ${call.id}`);
check(JSON.parse(call.function.arguments).city === "Paris", "arguments are JSON text");

// Streamed, folded by hand.
let args = "", name = null, id = null, finish = null;
for await (const chunk of await client.chat.completions.create({ model, messages, tools, max_tokens: 200, stream: true })) {
  for (const c of chunk.choices) {
    for (const tc of c.delta?.tool_calls ?? []) {
      check(tc.index === 0, "one call, index 0");
      if (tc.id) { id = tc.id; name = tc.function.name; }
      args += tc.function?.arguments ?? "";
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(finish === "tool_calls" && name === "get_weather" && id, "streamed call");
check(args === call.function.arguments, `streamed arguments ${args}`);

// The client's stream helper assembles the same message.
const helper = client.beta.chat.completions.stream({ model, messages, tools, max_tokens: 200 });
const final = await helper.finalChatCompletion();
const fc = final.choices[0].message.tool_calls?.[0];
check(fc?.function?.name === "get_weather" && fc.function.arguments === call.function.arguments,
      `stream helper's message ${JSON.stringify(final.choices[0].message)}`);

// The call and its result as history.
const next = await client.chat.completions.create({
  model, tools, max_tokens: 5,
  messages: [...messages, msg, { role: "tool", tool_call_id: call.id, content: "sunny, 21 C" }],
});
check(next.object === "chat.completion", "history with a tool result is accepted");

// A bad tool_choice is a 400 APIError.
try {
  await client.chat.completions.create({ model, messages, tools, tool_choice: { type: "function", function: { name: "nope" } } });
  fail("unknown tool_choice name accepted");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 400, `400 APIError, got ${e}`);
}
console.log(JSON.stringify({ ok: true, call }));
