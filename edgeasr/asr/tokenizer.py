"""Token ids <-> text with the bundle's tokenizer.json (Hugging Face `tokenizers`, no transformers)."""

from __future__ import annotations

from tokenizers import Tokenizer as _HfTokenizer

from edgeasr.bundle import Bundle


class Tokenizer:
    def __init__(self, bundle: Bundle) -> None:
        self._tok = _HfTokenizer.from_file(str(bundle.path("tokenizer")))
        self.tokens = bundle.tokens

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        """Text of the ordinary tokens; special and timestamp tokens are left out."""
        return self._tok.decode([i for i in ids if i < self.tokens.eot])

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids
