"""Finding what a config names: a Keras class by any spelling of its name, a keyword it takes, or a user's
``package.module:function``; a miss is a :class:`~accumrun.errors.ConfigError` that suggests the closest name.

Optimizers and schedules (:mod:`accumrun.optim`), losses and metrics (:mod:`accumrun.objective`) and models
(:mod:`accumrun.models.registry`) are all found this way. :func:`import_keras_hub` imports the optional KerasHub
package, a missing install being one line that names the ``text`` extra.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from accumrun.errors import ConfigError
from accumrun.sections import as_flag


def normalized(name: str) -> str:
    """``AdamW``, ``adam_w`` and ``adamw`` all name the same class."""
    return name.replace("_", "").lower()


def classes_in(module: ModuleType, base: type, exclude: Iterable[str] = ()) -> dict[str, type]:
    """The subclasses of ``base`` that ``module`` exports (``base`` itself left out), by normalized name."""
    excluded = set(exclude)
    return {
        normalized(name): cls
        for name, cls in vars(module).items()
        if isinstance(cls, type) and issubclass(cls, base) and cls is not base and name not in excluded
    }


def find(found: dict[str, Any], name: str, path: str, kind: str) -> Any:
    """``found[normalized(name)]``, or a ConfigError at ``path`` that suggests the closest ``kind``.

    Raises:
        ConfigError: no entry has that name.
    """
    match = found.get(normalized(name))
    if match is not None:
        return match
    names = sorted(_display_name(value, key) for key, value in found.items())
    # A transposition ("adma") should suggest the anagram, which difflib may rank below a longer name.
    anagrams = [key for key in found if sorted(key) == sorted(normalized(name))]
    close = anagrams or difflib.get_close_matches(normalized(name), list(found), n=1)
    hint = f"did you mean '{_display_name(found[close[0]], close[0])}'?" if close else f"known: {', '.join(names)}"
    raise ConfigError(path, f"unknown {kind}; {hint}", name)


def _display_name(value: Any, key: str) -> str:
    return str(getattr(value, "__name__", key))


def checked_keywords(
    function: Callable[..., Any],
    keywords: dict[str, Any],
    path: str,
    owner: str,
    positive: Iterable[str] = (),
    refused: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``keywords`` for ``function`` (a class: its ``__init__``), where a keyword whose default is a boolean reads
    yes/no/on/off as one (:func:`accumrun.sections.as_flag`). Refuse a keyword that ``function`` does not take, with
    the closest one it does; a keyword in ``refused``, for its reason (and never offer it); a text where it expects
    a number or a boolean; and a value of 0 or less for a keyword in ``positive``.

    Raises:
        ConfigError: at ``path.<keyword>``.
    """
    parameters = inspect.signature(function).parameters  # a class's is its __init__'s, less self
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    refused = refused or {}
    accepted = [name for name, p in parameters.items() if name not in ("self", *refused) and p.kind in named]
    settled = {}
    for key, value in keywords.items():
        if key in refused:
            raise ConfigError(f"{path}.{key}", refused[key], value)
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"it takes: {', '.join(accepted)}"
            raise ConfigError(f"{path}.{key}", f"{owner} has no such argument; {hint}", value)
        default = parameters[key].default
        if isinstance(default, bool):
            value = as_flag(value)
            if not isinstance(value, bool):  # Keras keeps any text, and a text is true
                raise ConfigError(f"{path}.{key}", "must be true or false (or yes/no, on/off)", value)
        # Keras keeps a wrong-typed number as given, and it fails only later, inside the compiled step.
        numeric_default = isinstance(default, int | float) and not isinstance(default, bool)
        if numeric_default and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"{path}.{key}", "must be a number", value)
        if key in positive and value is not None and value <= 0:
            raise ConfigError(f"{path}.{key}", "must be > 0 (Keras ignores it otherwise)", value)
        settled[key] = value
    return settled


def with_flags_read(function: Callable[..., Any], keywords: dict[str, Any]) -> dict[str, Any]:
    """``keywords`` for a function of the user's (which may take ``**kwargs``, so nothing is refused): a keyword it
    declares with a boolean default reads yes/no/on/off as that boolean, as YAML 1.1 did."""
    parameters = inspect.signature(function).parameters
    return {
        key: as_flag(value) if key in parameters and isinstance(parameters[key].default, bool) else value
        for key, value in keywords.items()
    }


def import_function(reference: str, path: str) -> Callable[..., Any]:
    """The function that ``package.module:function`` names, imported from the working directory too.

    Raises:
        ConfigError: at ``path``, when the module cannot be imported or has no such function.
    """
    module_name, _, function_name = reference.partition(":")
    # A console script does not put the working directory on sys.path; user code usually lives there.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module may fail in any way while it is imported
        reason = f"{type(error).__name__}: {error}"
        raise ConfigError(path, f"cannot import module '{module_name}': {reason}", reference) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(path, f"module '{module_name}' has no function '{function_name}'", reference)
    return function


TEXT_EXTRA = "pip install 'accumrun[text]'"
"""How to install what a KerasHub model or tokenizer needs."""


def import_keras_hub(key: str) -> Any:
    """The ``keras_hub`` package.

    Raises:
        ConfigError: under ``key``, it is not installed; the message names the extra.
    """
    try:
        import keras_hub
    except ImportError:
        raise ConfigError(key, f"needs KerasHub, which is not installed: {TEXT_EXTRA}") from None
    return keras_hub
