#!/usr/bin/env python3
"""Differential vectors for the hand-written split patterns.

Splits fixed-seed random text with the real regexes (Python `regex` module,
which supports \\p{..} classes and lookahead) and writes
tests/tokenizer/data/split_vectors.json: [{"pattern", "text", "pieces"}].
test_units.cpp checks that src/pretokenize.cpp splits every text the same way.

    python3 tests/tokenizer/make_split_vectors.py
"""
import json
import os
import random

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
CONTRACTIONS = "'s|'t|'re|'ve|'m|'ll|'d"
PATTERNS = {
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "o200k": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}

# Characters from long-assigned blocks, so both Unicode versions agree.
ALPHABET = list("aBcDeFxyZ'sStTrReEvVmMlLdD0123456789 \t\n\r/.,!?-_()[]{}\"'") + [
    "\u00a0", "\u3000", "\u2003", "\u0085", "\u000b", "\u000c",  # spaces
    "é", "ñ", "ß", "Ǆ", "ǅ", "ǆ", "ʰ", "ˤ", "ª",            # letters, titlecase, modifiers
    "\u0301", "\u0308", "\u0903", "\u20dd",                   # marks Mn/Mc/Me
    "½", "²", "Ⅻ", "①", "٣", "१",                           # numbers No/Nl/Nd
    "我", "想", "東", "한", "ก", "ា", "ि", "Ж", "ж", "ا", "ש",
    "😀", "🦙", "\u200d", "\ufe0f", "€", "©", "—", "…", "\u200b",
]


def main():
    rng = random.Random(20261122)
    texts = ["", " ", "  ", "\n", " \n", "a  b", "I'M", "don'T", "ǅa", "Ǆǆ", "ʰa", "a\u0301b", " \u0301", "1/2",
             "!!!/\n\n", "x \n\n y", "  \t\n  ", "😀😀 a", "'s's", "'S", "A'LL", "abc'sx"]
    for _ in range(400):
        n = rng.randint(1, 24)
        texts.append("".join(rng.choice(ALPHABET) for _ in range(n)))
    out = []
    for name, pat in PATTERNS.items():
        rx = regex.compile(pat)
        for t in texts:
            pieces = rx.findall(t)
            assert "".join(pieces) == t, (name, t)
            out.append({"pattern": name, "text": t, "pieces": pieces})
    path = os.path.join(HERE, "data", "split_vectors.json")
    with open(path, "w", encoding="ascii") as f:
        json.dump(out, f, ensure_ascii=True)
        f.write("\n")
    print("wrote %d vectors to %s" % (len(out), path))


if __name__ == "__main__":
    main()
