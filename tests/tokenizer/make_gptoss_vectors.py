#!/usr/bin/env python3
"""Expected gpt-oss (o200k harmony) token ids for tests/tokenizer/data/multilingual.inp.

Runs the reference implementation, Hugging Face `tokenizers`, on the gpt-oss
tokenizer.json from the shared test data and writes one line of ids per
string (each id preceded by a space, as llama.cpp's .out files), with
add_special_tokens=False. The C++ test (test_gptoss.cpp) compares against it.

    python3 tests/tokenizer/make_gptoss_vectors.py [--testdata ../shared/testdata]
"""
import argparse
import os
import sys

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
SEP = "\n__ggml_vocab_test__\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testdata", default=os.path.join(HERE, "..", "..", "..", "shared", "testdata"))
    ap.add_argument("--corpus", default=os.path.join(HERE, "data", "multilingual.inp"))
    ap.add_argument("--out", default=os.path.join(HERE, "data", "multilingual.gptoss.out"))
    args = ap.parse_args()

    tok = Tokenizer.from_file(os.path.join(args.testdata, "tokenizers", "gpt-oss-20b", "tokenizer.json"))
    with open(args.corpus, encoding="utf-8", newline="") as f:
        data = f.read()
    texts = data.split(SEP)
    if texts and texts[-1] == "":
        texts.pop()
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for t in texts:
            ids = tok.encode(t, add_special_tokens=False).ids
            f.write("".join(" %d" % i for i in ids) + "\n")
    print("wrote %d vectors to %s" % (len(texts), args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
