"""Trains the default model's vocabulary on generated text and writes it as
tokenizer.json (see spm_bpe.py for the format and how engine-host reads it).

    python3 prepare.py --out tokenizer.json [--samples 20000] [--vocab 4096]

Deterministic: the same arguments give the same file. Its own seed (1000) is
not one train.py uses for training or held-out text.
"""

import argparse
from collections import Counter

import spm_bpe
import tales


def fragments(kind, s):
    return [s] if kind == "story" else [f"User: {u}\nAssistant: {a}" for u, a in s]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--vocab", type=int, default=4096, help="upper bound; merges stop when no pair repeats")
    a = ap.parse_args()
    counts = Counter()
    for kind, s in tales.samples(1000, a.samples):
        for fr in fragments(kind, s):
            counts.update(spm_bpe.pieces(fr))
    tokens, merges = spm_bpe.train(counts, a.vocab)
    enc = spm_bpe.Encoder(tokens, merges)
    for kind, s in tales.samples(7, 200):  # round trip: the vocabulary covers its text
        for fr in fragments(kind, s):
            assert enc.decode(enc.fragment(fr), tokens) == " " + fr
    spm_bpe.save(a.out, tokens, merges)
    print(f"{a.out}: {len(tokens)} tokens, {len(merges)} merges, from {len(counts)} distinct pieces")


if __name__ == "__main__":
    main()
