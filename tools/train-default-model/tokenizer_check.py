"""Writes tokenizer_check.json: texts and the ids spm_bpe.py gives them with
the committed vocabulary. tests/http/default_model_test.cpp asks the served
model's tokenizer for the same texts, so a change in engine-host's tokenizer
that would feed the shipped model other ids than it was trained on fails CI.

    python3 tokenizer_check.py      # rewrites tokenizer_check.json
"""

import json
import os

import spm_bpe
import tales

here = os.path.dirname(os.path.abspath(__file__))
tokens, merges = spm_bpe.load(os.path.join(here, "tokenizer.json"))
enc = spm_bpe.Encoder(tokens, merges)
texts = ["Once upon a time", "Hello there, Zoë! What's up?  Two  spaces.\nA new line", "  leading and trailing  ",
         "Tell me a story about a dragon named Xyzzy.", "naïve café — 你好 🦉", "User: Hi!\nAssistant:"]
for kind, s in tales.samples(4242, 30):
    texts.append(s if kind == "story" else f"User: {s[0][0]}\nAssistant: {s[0][1]}")
cases = [{"text": t, "ids": enc.fragment(t)} for t in texts]
with open(os.path.join(here, "tokenizer_check.json"), "w", encoding="utf-8") as f:
    f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n")
print(f"tokenizer_check.json: {len(cases)} texts")
