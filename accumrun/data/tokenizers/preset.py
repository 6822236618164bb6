"""``data.tokenizer: {name: preset, path: FOLDER}``: the tokenizer of a local KerasHub preset."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import Field

from accumrun.data.tokenizers.base import Tokenizer, TokenizerSection
from accumrun.data.tokenizers.hub import KerasHubTokenizer
from accumrun.errors import ConfigError
from accumrun.lookup import import_keras_hub


class PresetTokenizerConfig(TokenizerSection):
    """``tokenizer: {name: preset, path: FOLDER}``: a local KerasHub preset's tokenizer; its id 0 must pad."""

    keras_hub = True
    name: Literal["preset"]
    path: str = Field(min_length=1)

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        folder = Path(self.path)
        files = [folder / "tokenizer.json", *sorted((folder / "assets").rglob("*"))]
        return {"name": self.name, "files": {str(f.relative_to(folder)): file_hash(f) for f in files if f.is_file()}}


def build_preset(config: PresetTokenizerConfig) -> Tokenizer:
    """The tokenizer of a KerasHub preset folder."""
    key, source = "data.tokenizer.path", Path(config.path)
    keras_hub = import_keras_hub(key)
    if not (source / "tokenizer.json").is_file():
        where = "folder not found" if not source.is_dir() else "holds no KerasHub tokenizer (tokenizer.json)"
        raise ConfigError(key, where, str(source))
    try:
        tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(str(source))
    except (ValueError, OSError, TypeError) as error:
        raise ConfigError(key, f"cannot be loaded: {' '.join(str(error).split())}") from None
    # A preset's tokenizer (a BPE) may merge across lines.
    return KerasHubTokenizer(tokenizer, False, key, str(source))
