"""``data.tokenizer: {name: sentence_piece, vocabulary_size: N}``: a SentencePiece model learned from the training
texts with the ``sentencepiece`` package, kept in the run's ``tokenizer/sentence_piece.model``, that gives any text
back byte for byte; :class:`SentencePieceTokenizer` reads it.

Ids: 0 pads, 1 is unknown (never made: byte fallback spells every character), 2 is the line break, 3 to 258 are the
bytes 0x00 to 0xFF, and the learned pieces follow.
"""

from __future__ import annotations

import hashlib
import io
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, PrivateAttr

from accumrun.core.tokens import PADDING_ID
from accumrun.data.tokenizers.base import Learning, Tokenizer, TokenizerSection
from accumrun.errors import ConfigError, DataError
from accumrun.lookup import TEXT_EXTRA
from accumrun.rundir.layout import SENTENCE_PIECE_FILE, read_sentence_piece, write_sentence_piece

if TYPE_CHECKING:
    import tensorflow as tf

KEY = "data.tokenizer.vocabulary_size"
_LONGEST_LINE = 1 << 16
"""Bytes in the longest line the trainer learns from (its default, 4,192, would skip long prose paragraphs); a longer
line is still encoded, only not learned from."""
# How the trainer says that the vocabulary cannot hold the texts' characters: "... required_chars. 300 vs 356. ..."
_TOO_SMALL = re.compile(r"smaller than required_chars\. \d+ vs (\d+)")
# A normalization table of one rule, U+10FFFF (the last code point) to U+10FFFE, later made U+10FFFF to itself: see
# _as_is. The table is the rule's source trie, then its targets, each ending in a NUL.
_RULE = "10FFFF\t10FFFE\n"
_TARGET, _SAME = "\U0010fffe\0".encode(), "\U0010ffff\0".encode()

SENTENCE_PIECE_RESERVED = 259
"""The ids a learned SentencePiece model holds whatever the texts: padding (0), unknown (1), the line break (2) and
the 256 bytes that spell any other character (3 to 258)."""


class SentencePieceTokenizerConfig(TokenizerSection):
    """``tokenizer: {name: sentence_piece, vocabulary_size: N}``: a SentencePiece BPE model of at most N ids learned
    from the training texts and saved in the run folder. Its decoding gives any text back byte for byte (spaces, line
    breaks, tabs, indentation): what a language model needs."""

    name: Literal["sentence_piece"]
    # The reserved ids, and at least one more: the training texts' own characters need more (the trainer says how many).
    vocabulary_size: int = Field(ge=SENTENCE_PIECE_RESERVED + 1)
    _model: bytes | None = PrivateAttr(None)

    @property
    def learns_at_most(self) -> int | None:
        """Always ``vocabulary_size``: the model is learned from the training texts (a ``tokens`` source, which has
        none, refuses it)."""
        return self.vocabulary_size

    @property
    def model(self) -> bytes | None:
        """The learned model (a serialized SentencePiece ``ModelProto``), once ``settle_vocabulary`` settles it."""
        return self._model

    def with_model(self, model: bytes) -> SentencePieceTokenizerConfig:
        """This section with its learned ``model`` settled."""
        settled = self.model_copy()
        settled._model = model
        return settled

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        # Ids are cached only once there is a model (as a corpus is cut once there is a vocabulary).
        assert self.model is not None, "a learned SentencePiece model is settled before its ids are cached"
        identity: dict[str, object] = {**self.model_dump(), "model": hashlib.sha256(self.model).hexdigest()}
        # The host's ids are the sentencepiece package's, as a KerasHub tokenizer's are KerasHub's.
        try:
            identity["sentencepiece"] = metadata.version("sentencepiece")
        except metadata.PackageNotFoundError:
            identity["sentencepiece"] = None
        return identity


class SentencePieceTokenizer(Tokenizer):
    """A learned SentencePiece model: the ``sentencepiece`` package on the host, tensorflow-text's op in a graph, with
    the same ids; decoding gives the text back byte for byte. The line break is a piece that no other contains, so a
    text's ids are its lines' ids (``line_local``)."""

    loader_imports = ("tensorflow_text",)

    def __init__(self, model: bytes) -> None:
        self._model = model
        self._pieces = import_sentencepiece().SentencePieceProcessor(model_proto=model)
        self.vocabulary_size = int(self._pieces.get_piece_size())

    def ids(self, text: str) -> np.ndarray:
        return np.asarray(self._pieces.encode(text), np.int32).reshape(-1)

    def encode_tensor(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        import tensorflow as tf

        # Made at each call, in the caller's graph, never kept: tensorflow-text's model belongs to the kernel that
        # reads it, and TensorFlow drops its eager kernels whenever a seed is set (keras.utils.set_random_seed), so
        # an input pipeline given a model read eagerly once would later find it gone.
        ids = import_tensorflow_text().SentencepieceTokenizer(model=self._model).tokenize(texts)
        return tf.cast(ids[:, :length], tf.int32).to_tensor(default_value=PADDING_ID, shape=[None, length])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        # Bytes cut mid-character (a generation that stopped there) decode as U+FFFD, one per byte.
        return str(self._pieces.decode(self._checked(ids).tolist()))


def build_sentence_piece(config: SentencePieceTokenizerConfig) -> Tokenizer:
    """The SentencePiece model that accumrun.data.vocabulary settled (learned, or the run's)."""
    if config.model is None:
        raise ValueError("a learned SentencePiece model is read only after accumrun.data.vocabulary settles it")
    return SentencePieceTokenizer(config.model)


def learn_sentence_piece(texts: list[str], config: SentencePieceTokenizerConfig) -> bytes:
    """A model of at most ``config.vocabulary_size`` ids learned from ``texts`` (a serialized ``ModelProto``): the
    same texts give the same bytes. A vocabulary too small for the texts' characters is a ConfigError; texts with
    nothing to learn from, a DataError."""
    spm = import_sentencepiece()
    model = io.BytesIO()
    with tempfile.TemporaryDirectory() as folder:
        rule = Path(folder) / "rule.tsv"
        rule.write_text(_RULE, encoding="utf-8")
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=_lines(texts),
                model_writer=model,
                vocab_size=config.vocabulary_size,
                # BPE: the host's sentencepiece and tensorflow-text's op (an older SentencePiece) segment alike.
                # Their unigram segmentations differ on up to 0.6% of lines of code and prose: the graph and the
                # host would give other ids for the same text.
                model_type="bpe",
                # Every byte of the text is kept: no Unicode normalization (NFKC would fold ligatures and full-width
                # forms; the one rule is undone below), no trimmed or merged spaces, no space added in front.
                normalization_rule_tsv=str(rule),
                remove_extra_whitespaces=False,
                add_dummy_prefix=False,
                # A character outside the vocabulary is spelled in its UTF-8 bytes, never unknown.
                byte_fallback=True,
                # Runs of spaces become pieces of their own: indentation costs a token, not one per space.
                allow_whitespace_only_pieces=True,
                # The line break is one piece that no other contains, so a text's ids are its lines' ids one after
                # another (how a corpus too big for memory is tokenized) and a generated line break decodes as one.
                user_defined_symbols=["\n"],
                pad_id=0,
                unk_id=1,
                bos_id=-1,
                eos_id=-1,
                # Fewer ids than asked when the texts hold no more, as word_piece learns.
                hard_vocab_limit=False,
                max_sentence_length=_LONGEST_LINE,
                # One thread: the same texts give the same model.
                num_threads=1,
                minloglevel=2,
            )
        except RuntimeError as error:
            raise _refusal(str(error), config.vocabulary_size) from None
    return _as_is(model.getvalue())


def sentence_piece_size(model: bytes) -> int:
    """How many ids ``model`` has, padding's 0 among them."""
    return len(_parsed(model).pieces)


def import_sentencepiece() -> Any:
    """The ``sentencepiece`` package; a ConfigError names the extra where it is not installed."""
    try:
        import sentencepiece
    except ImportError:
        raise ConfigError("data.tokenizer", f"needs sentencepiece, which is not installed: {TEXT_EXTRA}") from None
    return sentencepiece


def import_tensorflow_text() -> Any:
    """The ``tensorflow_text`` package (the model's TensorFlow op); a ConfigError names the extra where it is not
    installed."""
    try:
        import tensorflow_text
    except ImportError:
        raise ConfigError("data.tokenizer", f"needs tensorflow-text, which is not installed: {TEXT_EXTRA}") from None
    return tensorflow_text


def _lines(texts: list[str]) -> Iterator[str]:
    """The texts' lines without their line breaks (the break is a piece of its own), empty ones left out."""
    for text in texts:
        yield from (line for line in text.split("\n") if line)


def _refusal(message: str, vocabulary_size: int) -> ConfigError | DataError:
    """The trainer's ``message`` as the user's fault: too few ids, no text, or (rare) whatever else it says."""
    needed = _TOO_SMALL.search(message)
    if needed is not None:
        characters = int(needed.group(1)) - SENTENCE_PIECE_RESERVED
        what = (
            f"too small for the training texts: it needs at least {needed.group(1)} ids, {SENTENCE_PIECE_RESERVED} "
            f"reserved (padding, unknown, the line break, 256 bytes) and {characters} for the texts' characters"
        )
        return ConfigError(KEY, what, vocabulary_size)
    if "sentences_.empty()" in message:
        return DataError("data.path", "the training texts hold no text to learn data.tokenizer's vocabulary from")
    return ConfigError("data.tokenizer", f"SentencePiece cannot learn from the training texts: {message.strip()}")


def _as_is(model: bytes) -> bytes:
    """``model`` made to keep every text as it is, in two edits that its trainer refuses to learn with.

    - Spaces are written as spaces. The trainer writes a space as U+2581 (▁) in its pieces, and decoding turns every
      U+2581 into a space, so a text's own ▁ would come back as a space. Unescaped, a space is a space, and a ▁ in
      the text is spelled in its bytes.
    - Its one normalization rule maps U+10FFFF to itself. An empty table would do the same, but tensorflow-text then
      prints ``precompiled_charsmap is empty`` on stderr each time it reads the model, in every input pipeline; the
      trainer refuses a rule that changes nothing, so the rule's target is rewritten in place (same length).
    """
    proto = _parsed(model)
    proto.normalizer_spec.escape_whitespaces = False
    for piece in proto.pieces:
        piece.piece = piece.piece.replace("\u2581", " ")
    table = proto.normalizer_spec.precompiled_charsmap
    assert table.endswith(_TARGET), "the normalization table's layout changed"  # the one target is its last bytes
    proto.normalizer_spec.precompiled_charsmap = table[: -len(_TARGET)] + _SAME
    proto.normalizer_spec.normalization_rule_tsv = ""  # the rule's file, gone with the temporary folder
    return bytes(proto.SerializeToString())


def _parsed(model: bytes) -> Any:
    """``model`` as a SentencePiece ``ModelProto`` message."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # protobuf makes it at import
    proto.ParseFromString(model)
    return proto


SENTENCE_PIECE_LEARNING: Learning[SentencePieceTokenizerConfig, bytes] = Learning(
    SENTENCE_PIECE_FILE,
    "model",
    learn=learn_sentence_piece,
    settle=SentencePieceTokenizerConfig.with_model,
    settled=lambda config: config.model,
    read=read_sentence_piece,
    write=write_sentence_piece,
    size=sentence_piece_size,
)
"""The model is learned from the training texts, kept in the run's ``tokenizer/sentence_piece.model``."""
