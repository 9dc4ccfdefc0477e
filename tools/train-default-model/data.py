"""Writes the token streams train.py learns from: generated samples (tales.py)
encoded as engine-host would encode them (spm_bpe.py), as little-endian
uint16 files. Held-out text comes from seeds that training never uses.

    python3 data.py --tokenizer tokenizer.json --out DIR [--train-samples N] [--procs P]

No PyTorch here: worker processes hand back plain bytes.
"""

import argparse
import array
import multiprocessing as mp
import os
import sys
import time

import spm_bpe
import tales

TRAIN_SEED0, HELDOUT_SEED0 = 1_000_000, 9_000_000


def encode_sample(enc, kind, s):
    """Token ids as engine-host sees the same text: a story is a completion
    prompt (BOS + text) ending in EOS; a chat is what the model's chat
    template renders, each turn a fragment after a special token (so it gets
    the "▁" prefix) ending in EOS."""
    if kind == "story":
        return [spm_bpe.BOS] + enc.fragment(s) + [spm_bpe.EOS]
    ids = [spm_bpe.BOS]
    for user, answer in s:
        ids += enc.fragment(f"User: {user}\nAssistant: {answer}") + [spm_bpe.EOS]
    return ids


_enc = None


def _shard(job):
    tok_path, seed, count = job
    global _enc
    if _enc is None:
        _enc = spm_bpe.Encoder(*spm_bpe.load(tok_path))
    out = array.array("H")
    for kind, s in tales.samples(seed, count):
        out.extend(encode_sample(_enc, kind, s))
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def write_stream(path, tok_path, seed0, samples, shards, procs):
    per = max(1, samples // shards)
    jobs = [(tok_path, seed0 + i, per) for i in range(shards)]
    if procs > 1:
        with mp.get_context("fork").Pool(procs) as pool:
            parts = pool.map(_shard, jobs)
    else:
        parts = [_shard(j) for j in jobs]
    with open(path, "wb") as f:
        for p in parts:
            f.write(p)
    return sum(len(p) for p in parts) // 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-samples", type=int, default=400000)
    ap.add_argument("--heldout-samples", type=int, default=2000)
    ap.add_argument("--procs", type=int, default=min(16, os.cpu_count() or 1))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    n = write_stream(os.path.join(a.out, "train.bin"), a.tokenizer, TRAIN_SEED0, a.train_samples, 64, a.procs)
    m = write_stream(os.path.join(a.out, "heldout.bin"), a.tokenizer, HELDOUT_SEED0, a.heldout_samples, 16, a.procs)
    print(f"data: {n:,} train tokens, {m:,} held-out tokens, {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
