// The chat page: a conversation kept in the browser, each reply streamed
// from POST /v1/chat/completions (server-sent events), model facts from
// GET /health (open even when the server requires an API key). No
// libraries: this file is all of it.
"use strict";

const $ = (id) => document.getElementById(id);
const messages = [];   // {role, content} sent with every request
let controller = null; // AbortController of the reply being streamed
let contextLength = 0; // the model's context in tokens (GET /health), 0 until known
let contextUsed = 0;   // tokens of the conversation after the last reply (its usage), 0 when unknown

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("conversation").appendChild(div);
  div.scrollIntoView({block: "end"});
  return div;
}

async function showHealth() {
  const info = $("model-info");
  try {
    const h = await (await fetch("/health")).json();
    info.dataset.status = h.status;
    if (h.status === "loading") {
      info.textContent = `loading ${h.model || "model"}… ${Math.round(100 * (h.load_progress || 0))}%`;
      setTimeout(showHealth, 1000);
      return;
    }
    const parts = [h.model, h.plugin && h.plugin.name, h.device, h.quant_kind,
                   h.context_length && `context ${h.context_length}`, h.status !== "healthy" && h.status];
    contextLength = h.context_length || 0;
    info.textContent = parts.filter(Boolean).join(" · ");
    info.title = JSON.stringify(h, null, 1);
  } catch (e) {
    info.dataset.status = "error";
    info.textContent = "server not reachable";
  }
}

// The API key for servers started with --api-key: typed by the user, kept
// for this tab only, sent as "Authorization: Bearer KEY".
function requestHeaders() {
  const headers = {"Content-Type": "application/json"};
  const key = $("api_key").value.trim();
  if (key) headers.Authorization = "Bearer " + key;
  return headers;
}
$("api_key").value = sessionStorage.getItem("engine-host-api-key") || "";
$("api_key").addEventListener("change", () => sessionStorage.setItem("engine-host-api-key", $("api_key").value.trim()));

function numberSetting(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

// `maxTokens` undefined: no max_tokens, so the server gives the reply all
// the context has left after the prompt (it counts the prompt's tokens).
function requestBody(maxTokens) {
  const system = $("system").value.trim();
  const body = {
    messages: system ? [{role: "system", content: system}, ...messages] : messages,
    stream: true,
    stream_options: {include_usage: true},
    temperature: numberSetting("temperature"),
    top_p: numberSetting("top_p"),
    max_tokens: maxTokens,
    seed: numberSetting("seed"),
  };
  const topK = numberSetting("top_k");
  if (topK) body.top_k = topK;
  return JSON.stringify(body);
}

// Reads "data: ..." events from the response body; calls onData for each
// JSON payload until [DONE].
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      onData(JSON.parse(data));
    }
  }
}

function errorText(body) {
  return (body && body.error && (body.error.message || body.error.code)) || "request failed";
}

function contextFullText() {
  return `the conversation fills the context (${contextLength ? contextLength + " tokens" : "all of it"}); ` +
         "start a new one with New chat";
}

// POSTs the conversation, its reply capped at max_tokens and at what the
// context has left: a max_tokens above the room left is a 400 (param
// "max_tokens"), so then, or when the last reply's usage already shows too
// little room, the request goes without it and the server fills the room,
// which is less than max_tokens. A prompt that leaves no room at all is a
// 400 with param "prompt": the conversation is full.
async function postChat() {
  const wanted = numberSetting("max_tokens");
  const post = (maxTokens) => fetch("/v1/chat/completions", {
    method: "POST", headers: requestHeaders(), body: requestBody(maxTokens), signal: controller.signal,
  });
  const roomBefore = contextLength && contextUsed ? contextLength - contextUsed : Infinity;
  let capped = wanted === undefined || wanted >= roomBefore;
  let response = await post(capped ? undefined : wanted);
  let body = null;
  if (response.status === 400) {
    body = await response.json().catch(() => null);
    const param = body && body.error && body.error.param;
    if (param === "max_tokens" && !capped) {
      capped = true;
      response = await post(undefined);
      body = response.status === 400 ? await response.json().catch(() => null) : null;
    }
    const again = body && body.error && body.error.param;
    if (response.status === 400 && again === "prompt") throw new Error(contextFullText());
  }
  return {response, body, capped};
}

async function send(text) {
  messages.push({role: "user", content: text});
  addMessage("user", text);
  const reply = addMessage("assistant", "");
  reply.dataset.state = "streaming";
  reply.dataset.chunks = "0";
  let content = "";
  controller = new AbortController();
  setBusy(true);
  let filled = false;
  try {
    const {response, body, capped} = await postChat();
    if (response.status === 401) {
      $("settings").open = true;
      $("api_key").focus();
      throw new Error(errorText(await response.json().catch(() => null)) + " (enter the server's API key under Sampling)");
    }
    if (!response.ok) throw new Error(errorText(body || await response.json().catch(() => null)));
    let finish = null;
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(errorText(chunk));
      if (chunk.usage) {
        contextUsed = chunk.usage.prompt_tokens + chunk.usage.completion_tokens;
        filled = capped && finish === "length" && contextLength > 0 && contextUsed >= contextLength;
      }
      if (chunk.choices && chunk.choices[0] && chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (!delta || !delta.content) return;
      content += delta.content;
      reply.textContent = content.replace(/^\s+/, "");  // the first token often starts with a space
      reply.dataset.chunks = String(Number(reply.dataset.chunks) + 1);
      reply.scrollIntoView({block: "end"});
    });
    reply.dataset.state = "done";
    if (filled) {
      const note = addMessage("note", `(${contextFullText()})`);
      note.dataset.context = "full";
    }
  } catch (e) {
    if (e.name === "AbortError") {
      reply.dataset.state = "stopped";
    } else {
      reply.dataset.state = "error";
      reply.classList.add("error");
      reply.textContent = (content ? content.trim() + "\n" : "") + "Error: " + e.message;
    }
  } finally {
    controller = null;
    setBusy(false);
  }
  // A reply (a stopped one too) stays in the conversation; a turn that got
  // none is dropped, so user and assistant turns keep alternating. A model can
  // emit a NUL (a <0x00> byte token); the server refuses NUL in messages, so
  // the history keeps the reply without it (the page never showed it either).
  const kept = content.replace(/\u0000/g, "").trim();
  if (kept) messages.push({role: "assistant", content: kept});
  else messages.pop();
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.dataset.busy = busy ? "1" : "0";
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("reset").addEventListener("click", () => {
  if (controller) controller.abort();
  messages.length = 0;
  contextUsed = 0;
  $("conversation").replaceChildren();
});

setBusy(false);
showHealth();
