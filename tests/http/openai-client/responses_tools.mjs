// Function calling through the official `openai` npm client's Responses API:
// a served model whose output is some text and one get_weather call (the
// test engine, scripted), read whole, streamed through the client's
// ResponseStream (which assembles the call's arguments from
// function_call_arguments deltas), then the call's output sent back with
// previous_response_id, and the whole history sent back as input items.
// Usage: node responses_tools.mjs http://127.0.0.1:PORT   (exit 0 = every check passed)
import OpenAI from "openai";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };
const check = (cond, msg) => { if (!cond) fail(msg); };

const tools = [{
  type: "function", name: "get_weather", description: "Weather now", strict: false,
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
}];
const request = { model: "m", input: "Weather in Paris?", tools, tool_choice: "auto", max_output_tokens: 200 };

// Whole.
const resp = await client.responses.create(request);
check(resp.status === "completed", `status ${resp.status}`);
const call = resp.output.find((i) => i.type === "function_call");
check(call && call.name === "get_weather" && JSON.parse(call.arguments).city === "Paris", `a call, got ${JSON.stringify(resp.output)}`);
check(/^call_[A-Za-z0-9]{24}$/.test(call.call_id), `call_id ${call.call_id}`);
check(resp.output_text.includes("Checking."), `the text before the call: ${JSON.stringify(resp.output_text)}`);

// Streamed through the helper: the same call, its arguments assembled.
const stream = client.responses.stream(request);
let argDeltas = 0;
stream.on("response.function_call_arguments.delta", () => { argDeltas++; });
const final = await stream.finalResponse();
const streamed = final.output.find((i) => i.type === "function_call");
check(final.status === "completed", `streamed status ${final.status}`);
check(streamed && streamed.arguments === call.arguments, `streamed arguments ${JSON.stringify(streamed)}`);
check(argDeltas > 1, `arguments streamed in pieces (${argDeltas})`);

// The result, continued from the stored response.
const next = await client.responses.create({
  ...request, previous_response_id: resp.id, input: [{ type: "function_call_output", call_id: call.call_id, output: "sunny" }],
});
check(next.status === "completed" && next.usage.input_tokens > resp.usage.input_tokens, "continued with the call's output");

// The same history sent whole (no store): the same prompt, so the same count.
const stateless = await client.responses.create({
  ...request, store: false,
  input: [{ role: "user", content: "Weather in Paris?" }, ...resp.output,
          { type: "function_call_output", call_id: call.call_id, output: "sunny" }],
});
check(stateless.usage.input_tokens === next.usage.input_tokens,
      `history as items renders as the stored one (${stateless.usage.input_tokens} vs ${next.usage.input_tokens})`);
console.log(JSON.stringify({ ok: true, call: call.arguments, argDeltas }));
