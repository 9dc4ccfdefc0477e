#!/usr/bin/env python3
"""Reference chat-template renderings for tests/tokenizer/test_chat_template.cpp.

Renders fixed message lists with transformers' apply_chat_template (tokenize=False),
from the local tokenizer files under shared/testdata/tokenizers, and writes
tests/tokenizer/data/chat_vectors.json. The C++ test compares its own Jinja
interpreter against these strings byte for byte.

    python3 tests/tokenizer/make_chat_vectors.py [--testdata ../shared/testdata]

strftime_now is pinned to 2025-01-15 so the gpt-oss system message is stable.
--engine jinja2 renders with plain jinja2 set up as transformers sets it up
(for a machine without transformers); the file records which engine made it.
"""
import argparse
import datetime
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_NOW = datetime.datetime(2025, 1, 15, 0, 0, 0)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Forecast days", "default": 1},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    },
}

CASES = [
    ("simple", [{"role": "user", "content": "Hello!"}], None, {}),
    ("system_multi_turn", [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ], None, {}),
    ("unicode_whitespace", [
        {"role": "user", "content": "  Привет 😶\u200d🌫️ 我想在apple工作\n\n  code:\n\tx = 1\n"},
        {"role": "assistant", "content": "Ответ:\n```python\nprint('hi')\n```"},
        {"role": "user", "content": "ok"},
    ], None, {}),
    ("tool_call", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
    ], [WEATHER_TOOL], {}),
    ("reasoning", [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Bonjour !", "thinking": "The user greets me."},
        {"role": "user", "content": "How are you?"},
    ], None, {"reasoning_effort": "high"}),
]

# Tool history exactly as engine-host hands it to templates
# (host/service/src/tool_calls/template_messages.cpp): content always a
# string, arguments parsed into an object, the call's id after its function,
# tool_call_id on tool messages, reasoning as `thinking`.
CALL_PARIS = {"type": "function", "function": {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris"}},
              "id": "call_a1"}
CALL_TOKYO = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Tokyo", "days": 3}},
              "id": "call_b2"}
CASES += [
    ("tool_history", [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL_PARIS]},
        {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}", "tool_call_id": "call_a1"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        {"role": "user", "content": "Thanks! And tomorrow?"},
    ], [WEATHER_TOOL], {}),
    ("parallel_tool_calls", [
        {"role": "user", "content": "Paris and Tokyo, please."},
        {"role": "assistant", "content": "Checking both.", "tool_calls": [CALL_PARIS, CALL_TOKYO]},
        {"role": "tool", "content": "21", "tool_call_id": "call_a1"},
        {"role": "tool", "content": "17", "tool_call_id": "call_b2"},
    ], [WEATHER_TOOL], {}),
    ("tool_reasoning", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "thinking": "I should call get_weather.", "tool_calls": [CALL_PARIS]},
        {"role": "tool", "content": "{\"temperature\": 21}", "tool_call_id": "call_a1"},
    ], [WEATHER_TOOL], {"reasoning_effort": "low"}),
    ("tools_offered", [
        {"role": "user", "content": "What can you do?"},
    ], [WEATHER_TOOL], {"reasoning_effort": "high"}),
]

TEMPLATES = {
    "qwen2.5": ["simple", "system_multi_turn", "unicode_whitespace", "tool_call", "tool_history",
                "parallel_tool_calls", "tools_offered"],
    "phi-3-mini": ["simple", "system_multi_turn", "unicode_whitespace", "tool_history", "tools_offered"],
    "gpt-oss-20b": ["simple", "system_multi_turn", "unicode_whitespace", "tool_call", "reasoning", "tool_history",
                    "tool_reasoning", "tools_offered"],
}


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def jinja2_renderer(tok_dir):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    cfg = json.load(open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8"))
    template = cfg.get("chat_template")
    if template is None:
        template = open(os.path.join(tok_dir, "chat_template.jinja"), encoding="utf-8").read()

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    compiled = env.from_string(template)

    def tok_str(v):
        return v["content"] if isinstance(v, dict) else v

    specials = {k: tok_str(cfg.get(k)) for k in ("bos_token", "eos_token") if cfg.get(k) is not None}

    def render(messages, tools, add_generation_prompt, extra):
        return compiled.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                               **specials, **extra)

    return render, specials


def transformers_renderer(tok_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    specials = {}
    if tok.bos_token is not None:
        specials["bos_token"] = tok.bos_token
    if tok.eos_token is not None:
        specials["eos_token"] = tok.eos_token

    def render(messages, tools, add_generation_prompt, extra):
        return tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                       add_generation_prompt=add_generation_prompt,
                                       strftime_now=strftime_now, **extra)

    return render, specials


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testdata", default=os.path.join(HERE, "..", "..", "..", "shared", "testdata"))
    ap.add_argument("--out", default=os.path.join(HERE, "data", "chat_vectors.json"))
    ap.add_argument("--engine", choices=["transformers", "jinja2"], default="transformers")
    args = ap.parse_args()

    cases = {name: (msgs, tools, extra) for name, msgs, tools, extra in CASES}
    out = {"engine": args.engine, "now": FIXED_NOW.strftime("%Y-%m-%d %H:%M:%S"), "cases": []}
    if args.engine == "transformers":
        import transformers
        out["engine"] = "transformers " + transformers.__version__
    for template, names in TEMPLATES.items():
        tok_dir = os.path.join(args.testdata, "tokenizers", template)
        render, specials = (transformers_renderer if args.engine == "transformers" else jinja2_renderer)(tok_dir)
        for name in names:
            msgs, tools, extra = cases[name]
            for agp in (True, False):
                out["cases"].append({
                    "template": template,
                    "name": name,
                    "messages": msgs,
                    "tools": tools,
                    "add_generation_prompt": agp,
                    "extra": extra,
                    "bos_token": specials.get("bos_token", ""),
                    "eos_token": specials.get("eos_token", ""),
                    "expected": render(msgs, tools, agp, extra),
                })
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %d cases to %s" % (len(out["cases"]), args.out))


if __name__ == "__main__":
    main()
