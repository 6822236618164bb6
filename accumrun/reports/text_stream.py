"""Token ids to text as they come: each piece is printed once its text is complete.

A token is not always a whole character: a byte tokenizer writes a multi-byte UTF-8 character over several tokens,
and until the last one comes, decoding shows U+FFFD. Nor is a token's text always its own: a subword tokenizer's
piece can read differently alone than after the tokens before it. So each new token's text is read as the
difference between decoding a few tokens before it with and without it (the incremental detokenizing of vLLM and
Hugging Face's streamers), and is held back while it ends in an incomplete character. Only the tokens since the
last complete piece are decoded again, so a token costs the same however long the text grows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_INCOMPLETE = "\ufffd"


class TextStream:
    """Feeds token ids one at a time (:meth:`add`) and gives back the text that they complete."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        # The tokens whose text was given already, kept as context for the next piece's (a subword's leading space).
        self._given = 0

    def add(self, token: int) -> str:
        """The text that ``token`` completes: "" while it ends in part of a character."""
        self._ids.append(token)
        piece = self._pending()
        if piece.endswith(_INCOMPLETE):
            return ""
        self._ids = self._ids[self._given :]
        self._given = len(self._ids)
        return piece

    def finish(self) -> str:
        """The text still held back at the end (a character cut short stays U+FFFD, as any lenient reader shows
        it)."""
        piece = self._pending()
        self._ids, self._given = [], 0
        return piece

    def _pending(self) -> str:
        """The text of the tokens after the given ones, read in the context of the given ones."""
        return self._decode(self._ids)[len(self._decode(self._ids[: self._given])) :]
