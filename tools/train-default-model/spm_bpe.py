"""A SentencePiece-style BPE vocabulary: trained here on the generated text,
encoded exactly as engine-host's tokenizer encodes a GGUF "llama" vocabulary,
and written as a Hugging Face tokenizer.json that `engine-host convert` turns
into tokenizer.ggml.* metadata.

Facts this relies on (GGUF "llama" tokenizer, as host/tokenizer runs it):
- a text fragment gets "▁" in front (add_space_prefix) and every space
  becomes "▁";
- the fragment splits before each "▁" (that does not follow another "▁")
  when no token holds "▁" past its first character — true here, since merges
  never cross a word start;
- inside a piece, the adjacent pair whose concatenation is a token with the
  highest score merges first (leftmost on ties), until none is left;
  characters with no token fall back to <0xXX> byte tokens;
- `convert` scores a token by minus the rank of the first merge that makes
  it, so the merge order below becomes the score order.
"""

import heapq
import json
import re
from collections import Counter, defaultdict

META = "\u2581"  # ▁
SPECIALS = ["<unk>", "<s>", "</s>"]
UNK, BOS, EOS = 0, 1, 2


_PIECE = re.compile(f"{META}+[^{META}]*|[^{META}]+")


def pieces(fragment):
    """The pieces engine-host encodes separately: "▁" + text, split before
    each "▁" that does not follow another."""
    return _PIECE.findall(META + fragment.replace(" ", META))


def units(piece):
    """A piece cut where merges may not cross: letters (with a leading "▁")
    stay together, every other character stands alone. Tokens then never join
    a word to its punctuation, so "Eva." and "Eva?" share the token "▁Eva"."""
    out, cur = [], ""
    for ch in piece:
        if ch.isalpha() or (ch == META and not cur):
            cur += ch
        else:
            if cur:
                out.append(cur)
            cur = ""
            if ch == META:
                cur = ch
            else:
                out.append(ch)
    if cur:
        out.append(cur)
    return out


def train(piece_counts, vocab_size):
    """BPE merges over piece counts (merging inside units only): returns
    (tokens, merges) with tokens = specials, 256 byte tokens, characters by
    frequency, then merge results."""
    unit_counts = Counter()
    for p, c in piece_counts.items():
        for u in units(p):
            unit_counts[u] += c
    piece_counts = unit_counts
    chars = Counter()
    for p, c in piece_counts.items():
        for ch in p:
            chars[ch] += c
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [ch for ch, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))]
    have = set(tokens)
    words = [list(p) for p in piece_counts]
    counts = list(piece_counts.values())
    pair_count = Counter()
    where = defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += counts[i]
            where[(a, b)].add(i)
    merges = []
    while len(tokens) < vocab_size and pair_count:
        (a, b), n = max(pair_count.items(), key=lambda kv: (kv[1], kv[0]))
        if n < 2:
            break
        ab = a + b
        merges.append((a, b))
        if ab not in have:
            tokens.append(ab)
            have.add(ab)
        for i in list(where[(a, b)]):
            w, c = words[i], counts[i]
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= c
                if pair_count[(x, y)] <= 0:
                    del pair_count[(x, y)]
                where[(x, y)].discard(i)
            j, nw = 0, []
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(ab)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            words[i] = nw
            for x, y in zip(nw, nw[1:]):
                pair_count[(x, y)] += c
                where[(x, y)].add(i)
        del where[(a, b)]
    return tokens, merges


class Encoder:
    """Encodes as engine-host does for the vocabulary written by to_json."""

    def __init__(self, tokens, merges):
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.score = {}
        for r, (a, b) in enumerate(merges):
            self.score.setdefault(a + b, -float(r))
        for i, t in enumerate(tokens):
            if i >= len(SPECIALS) + 256:
                self.score.setdefault(t, 0.0)
        self.cache = {}

    def piece(self, p):
        got = self.cache.get(p)
        if got is not None:
            return got
        sym = list(p)
        heap = []

        def consider(k):
            if 0 <= k < len(sym) - 1 and sym[k] is not None:
                nxt = k + 1
                while nxt < len(sym) and sym[nxt] is None:
                    nxt += 1
                if nxt < len(sym):
                    s = self.score.get(sym[k] + sym[nxt])
                    if s is not None:
                        heapq.heappush(heap, (-s, k, sym[k], sym[nxt]))

        # symbols merged away become None; neighbours are found by skipping them
        for k in range(len(sym) - 1):
            consider(k)
        while heap:
            _, k, left, right = heapq.heappop(heap)
            if sym[k] != left:
                continue
            nxt = k + 1
            while nxt < len(sym) and sym[nxt] is None:
                nxt += 1
            if nxt >= len(sym) or sym[nxt] != right:
                continue
            sym[k] = left + right
            sym[nxt] = None
            prev = k - 1
            while prev >= 0 and sym[prev] is None:
                prev -= 1
            consider(prev)
            consider(k)
        out = []
        for s in sym:
            if s is None:
                continue
            i = self.ids.get(s)
            if i is not None:
                out.append(i)
            else:
                out.extend(self.ids[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
        self.cache[p] = out
        return out

    def fragment(self, text):
        out = []
        for p in pieces(text):
            out.extend(self.piece(p))
        return out

    def decode(self, ids, tokens):
        raw = bytearray()
        for i in ids:
            t = tokens[i]
            if t.startswith("<0x") and len(t) == 6:
                raw.append(int(t[3:5], 16))
            elif i >= len(SPECIALS):
                raw.extend(t.replace(META, " ").encode("utf-8"))
        return raw.decode("utf-8", errors="replace")


def to_json(tokens, merges):
    """tokenizer.json: BPE with byte fallback and a "▁" prefix (SentencePiece style)."""
    return {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(SPECIALS)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": META},
            {"type": "Replace", "pattern": {"String": " "}, "content": META}]},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": META}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [[a, b] for a, b in merges]},
    }


def save(path, tokens, merges):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_json(tokens, merges), f, ensure_ascii=False)


def load(path):
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    vocab = j["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    return tokens, [tuple(m) for m in j["model"]["merges"]]
