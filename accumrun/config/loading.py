"""Loading a config: YAML file (or mapping) < ``--set`` overrides, validated, with every problem listed at once,
each naming its key path, what is wrong and the value given. Resuming refuses changes the run's updates depend on.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from accumrun.config.schema import (
    UNION_SECTIONS,
    UNION_TAGS,
    Config,
    cross_field_problems,
    readers_of,
)
from accumrun.data.section import DataSection
from accumrun.errors import ConfigError, ConfigProblems, describe
from accumrun.kinds import BatchNormMode, RandomDraws
from accumrun.models.registry import kind_of

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails


class _Loader(yaml.SafeLoader):
    """YAML 1.1 as PyYAML reads it, with YAML 1.2's floats and booleans, and its unique keys:

    - ``1e-3`` and ``5e4`` are floats, not strings: a learning rate written that way would be refused as "not a
      number";
    - only ``true`` and ``false`` are booleans: ``yes``, ``no``, ``on`` and ``off`` stay text, so they can name a
      class, and a boolean key reads them as its booleans (:data:`accumrun.sections.Flag`);
    - a key written twice in one mapping is refused: PyYAML keeps the last silently, and a second ``training:``
      section would drop the first."""

    yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge (<<) may repeat keys by design; complex keys are refused by the schema
            key = (key_node.tag, key_node.value)
            if key in first_lines:
                problem = f"duplicate key '{key_node.value}' (first at line {first_lines[key]})"
                raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
            first_lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_config(source: str | Path | dict[str, Any], overrides: Sequence[str] = ()) -> Config:
    """Read a YAML config (a file, or a mapping of sections), apply ``key.path=value`` overrides and validate.

    Raises:
        ConfigError: the file is missing or not YAML, an override is malformed, or any value is invalid
            (all invalid values are listed in one error).
    """
    if isinstance(source, dict):
        raw, name = copy.deepcopy(source), "the config"
    else:
        raw, name = _read_yaml(Path(source)), str(source)
    for override in overrides:
        _apply_override(raw, override)
    try:
        config = Config.model_validate(raw)
    except ValidationError as error:
        raise ConfigProblems(name, [_describe_pydantic_error(e) for e in error.errors()]) from None
    problems = cross_field_problems(config)
    if problems:
        raise ConfigProblems(name, problems)
    return config


# What may change on resuming, as the updates do not depend on it: the epochs, what is written, the devices (the
# replicas share each global batch), the updates per compiled call (bit for bit the same) and data.cache (the
# pixels decoding gives, byte for byte).
_RESUMABLE_CHANGES = ("training.epochs", "training.updates_per_call", "output.", "distribute.", "data.cache")


def load_resume_config(run_dir: Path, config_path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """The config to resume the run in ``run_dir`` with: its saved ``config.yaml``, or ``config_path``, plus
    ``overrides``; only the keys of ``_RESUMABLE_CHANGES`` may differ from the config the run started with.

    Raises:
        ConfigError: ``run_dir`` is not a run directory, or the config changes something the run depends on.
    """
    saved_path = run_dir / "config.yaml"
    if not run_dir.is_dir():
        raise ConfigError("resume", "does not exist", str(run_dir))
    if not saved_path.is_file():
        raise ConfigError("resume", "is not an accumrun run directory (it has no config.yaml)", str(run_dir))
    saved = load_config(saved_path)
    raw = _read_yaml(saved_path)
    if saved.data.name == "npz" and "rescale" not in (raw.get("data") or {}):
        # A run from before data.rescale, when npz samples reached the model as the file held them.
        saved = saved.model_copy(update={"data": saved.data.model_copy(update={"rescale": False})})
    # A run from before a training mode key trained, and resumes, as before it: BatchNorm as sub_batch does, and
    # random layers drawing per sub-batch.
    before_the_key = {"batch_norm": BatchNormMode.SUB_BATCH, "random_draws": RandomDraws.PER_SUB_BATCH}
    old = {key: mode for key, mode in before_the_key.items() if key not in (raw.get("training") or {})}
    saved = saved.model_copy(update={"training": saved.training.model_copy(update=old)})
    saved = _with_old_model_keys(saved, raw)
    config = load_config(config_path or saved_path, overrides)
    given = raw if config_path is None else _read_yaml(Path(config_path))
    # Unset, a mode is the run's: the one it trained with.
    written = {*(given.get("training") or {}), *(o.partition("=")[0].removeprefix("training.") for o in overrides)}
    config = _with_settled(config, saved, [key for key in before_the_key if key not in written])
    written_model = {*(given.get("model") or {}), *(o.partition("=")[0].removeprefix("model.") for o in overrides)}
    config = _with_model_keys_of(config, saved, written_model)
    changed = [
        f"{key} ({before!r} -> {after!r})"
        for key, (before, after) in _differences(saved.model_dump(mode="json"), config.model_dump(mode="json"))
        if not key.startswith(_RESUMABLE_CHANGES)
    ]
    if changed:
        raise ConfigError(
            "resume",
            f"the config differs from the run's in {', '.join(changed)}; "
            "only training.epochs, training.updates_per_call, output.*, distribute.*, data.cache and data.cache_dir "
            "may change",
        )
    return config


def _with_old_model_keys(saved: Config, raw: dict[str, Any]) -> Config:
    """``saved`` as the run trained: a model key that its config.yaml lacks is from before the key, and takes the
    value runs had then (its kind's ``trained_before_key``: a transformer's attention had biases); new runs record
    every key."""
    model = saved.model
    old = {key: value for key, value in model.trained_before_key.items() if key not in (raw.get("model") or {})}
    return saved.model_copy(update={"model": model.model_copy(update=old)}) if old else saved


def _with_model_keys_of(config: Config, saved: Config, written: set[str]) -> Config:
    """``config`` with the run's values of the model keys added since runs were first written, where it does not
    write them: the original config file of a run from before a key resumes with what the run trained with."""
    if kind_of(config.model) is not kind_of(saved.model):
        return config
    kept = {key: getattr(saved.model, key) for key in config.model.trained_before_key if key not in written}
    return config.model_copy(update={"model": config.model.model_copy(update=kept)}) if kept else config


def _with_settled(config: Config, saved: Config, unset_modes: list[str]) -> Config:
    """``config`` with what it leaves to accumrun (``auto`` or unset, and the training modes ``unset_modes``) taken
    from what the run settled on, as its ``saved`` config records it."""
    training = config.training.model_copy(update={key: getattr(saved.training, key) for key in unset_modes})
    if training.fixed_subdivisions is None:
        training = training.model_copy(update={"subdivisions": saved.training.subdivisions})
    if training.remat == "auto":
        training = training.model_copy(update={"remat": saved.training.remat})
    data = config.data.model_copy(
        update={
            key: getattr(saved.data, key) for key in ("task", "rescale", "feed") if getattr(config.data, key) == "auto"
        }
    )
    loss = config.loss.model_copy(
        update={key: getattr(saved.loss, key) for key in ("name", "from_logits") if getattr(config.loss, key) is None}
    )
    metrics = saved.metrics if config.metrics is None else config.metrics
    return config.model_copy(update={"training": training, "data": data, "loss": loss, "metrics": metrics})


def _differences(before: Any, after: Any, prefix: str = "") -> list[tuple[str, tuple[Any, Any]]]:
    """The dotted keys whose values differ between two nested mappings, with both values."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys = list(dict.fromkeys([*before, *after]))
        return [d for k in keys for d in _differences(before.get(k), after.get(k), f"{prefix}{k}.")]
    return [] if before == after else [(prefix.rstrip("."), (before, after))]


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(str(path), "config file not found")
    try:
        raw = yaml.load(path.read_text(), Loader=_Loader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(str(path), f"invalid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not a text file") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "the top level must be a mapping of sections", type(raw).__name__)
    return raw


def _apply_override(raw: dict[str, Any], override: str) -> None:
    """Set ``a.b.c=value`` in the raw mapping; the value is parsed as YAML (a scalar, a list or a mapping)."""
    key, sep, text = override.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError("overrides", "expected KEY=VALUE with a dotted key such as training.subdivisions=4", override)
    try:
        value = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as error:
        if text.strip()[:1] in ("[", "{"):  # meant as a list or a mapping: say what is wrong with it
            raise ConfigError(key.strip(), f"invalid YAML: {getattr(error, 'problem', None) or error}", text) from None
        value = text
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: depth + 1]), f"is not a section, so --set {key} cannot apply", child)
        node = child
    node[parts[-1]] = _merged(node.get(parts[-1]), value)


def _merged(current: Any, value: Any) -> Any:
    """``value`` set over ``current``: a mapping merges into the section it names, key by key, as its deeper keys
    would (``--set data={sequence_length: 64}`` keeps the rest of ``data``), unless it names another kind (another
    ``name``), whose keys are its own; any other value replaces."""
    if not (isinstance(current, dict) and isinstance(value, dict)):
        return value
    if "name" in value and value["name"] != current.get("name", value["name"]):
        return value
    return {**current, **{key: _merged(current.get(key), item) for key, item in value.items()}}


def _describe_pydantic_error(error: ErrorDetails) -> str:
    loc = tuple(error["loc"])
    section = _section_at(loc)
    # Tagged unions add their tag to the location; users never wrote it, so drop it.
    loc = tuple(part for i, part in enumerate(loc) if not (i > 0 and part in UNION_TAGS.get(str(loc[i - 1]), ())))
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).removeprefix(".")
    key = str(loc[-1])
    if error["type"] == "extra_forbidden":
        if issubclass(section, DataSection) and readers_of(key):
            # Another source's key: say which sources read it rather than calling it unknown.
            return describe(path, f"only applies to data.name: {' or '.join(readers_of(key))}", error["input"])
        # A field excluded from the dump takes nothing (L-BFGS' clipnorm): it is not offered as a known key.
        known = [name for name, field in section.model_fields.items() if not field.exclude]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f"; known keys: {', '.join(known)}"
        return describe(path, f"unknown key{hint}")
    if error["type"] == "missing":
        if issubclass(section, DataSection) and key in section.needs:
            # The location's second part is the union's tag: the source's name.
            return describe(path, f"data.name: {error['loc'][1]} needs {section.needs[key]}")
        return describe(path, "required key is missing")
    if error["type"] == "model_type":
        # A section written as one value: the schema's class, which pydantic names, means nothing to the user.
        field = section.model_fields.get(key)
        named = key in UNION_SECTIONS or "name" in getattr(getattr(field, "annotation", None), "model_fields", {})
        example = f" such as {{name: {error['input']}}}" if named and isinstance(error["input"], str) else ""
        return describe(path, f"must be a mapping of keys{example}", error["input"])
    message = error["msg"].removeprefix("Value error, ")
    return describe(path, message[0].lower() + message[1:], error["input"])


def _section_at(loc: tuple[Any, ...]) -> type[BaseModel]:
    """The schema class that holds the key at the end of an error's location."""
    section: type[BaseModel] = Config
    for i, part in enumerate(loc[:-1]):
        tagged = UNION_SECTIONS.get(str(loc[i - 1]), {}) if i else {}
        field = section.model_fields.get(part) if isinstance(part, str) else None
        annotation = getattr(field, "annotation", None)
        if part in tagged:
            section = tagged[part]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            section = annotation
    return section
