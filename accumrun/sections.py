"""What every config section shares, whether it lives in :mod:`accumrun.config.schema` or beside a data source's
loader: the strict pydantic base, and the parsing of a closed set's words. It imports only ``kinds``, so that both
``config`` and ``data`` can sit above it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from accumrun.kinds import Kind


class Section(BaseModel):
    """A config section: strict types (YAML already typed the values) and no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True)


def listed(words: list[str]) -> str:
    """``'a', 'b' or 'c'``: the allowed words, as an error message lists them."""
    *others, last = (repr(word) for word in words)
    return f"{', '.join(others)} or {last}" if others else last


def words(kind: type[Kind], *, auto: bool = False) -> BeforeValidator:
    """Parse a member of ``kind`` from its word (and ``auto`` where the key allows it), naming every allowed word
    when the value is none of them."""
    allowed = ["auto", *kind.words()] if auto else kind.words()

    def parse(value: Any) -> Any:
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"input should be {listed(allowed)}")
        return value if value == "auto" else kind(value)

    return BeforeValidator(parse)
