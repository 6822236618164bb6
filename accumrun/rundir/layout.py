"""The run folder: where it is, which files are a run's, and how a new run claims the folder.

A folder is reused only to resume its run, or when the user says ``--overwrite``; then only the files a run
writes are removed, and a folder holding anything else is refused.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime
from pathlib import Path

from accumrun.errors import ArgumentError, ConfigError
from accumrun.kinds import RunState
from accumrun.rundir.atomic import write_atomically, write_text_atomically
from accumrun.rundir.status import read_status

# Everything a run writes; --overwrite removes these and nothing else.
RUN_FILES = (
    "run.json",
    "config.yaml",
    "labels.json",
    "features.json",
    "metrics.jsonl",
    "model.keras",
    "model.best.keras",
    "adapters.weights.h5",
    "adapters.best.weights.h5",
    "checkpoints",
    "tensorboard",
    "export",
    "tokenizer",
)
VOCABULARY_FILE = Path("tokenizer") / "vocabulary.txt"
"""A learned WordPiece vocabulary, in the run folder: one token per line, in id order."""
SENTENCE_PIECE_FILE = Path("tokenizer") / "sentence_piece.model"
"""A learned SentencePiece model, in the run folder: its serialized ``ModelProto``, as ``spm_train`` writes one."""
# What accumrun evaluate adds to a finished run: eval-val.json, eval-best-test.json, ...
_EVAL_FILE = re.compile(r"eval-(best-)?[a-z]+\.json")


def resolve_run_dir(template: str, config_name: str) -> Path:
    """Fill ``{config_name}`` and ``{timestamp}`` in ``output.run_dir``.

    Raises:
        ConfigError: the template has another placeholder.
    """
    try:
        return Path(template.format(config_name=config_name, timestamp=datetime.now().strftime("%Y%m%d-%H%M%S")))
    except (KeyError, IndexError, ValueError) as error:
        raise ConfigError(
            "output.run_dir", f"bad placeholder {error}; use {{config_name}} and {{timestamp}}", template
        ) from None


def prepare_run_dir(run_dir: Path, overwrite: bool = False) -> None:
    """Create ``run_dir`` for a new run. An existing non-empty one is refused, or emptied with ``overwrite``.

    Raises:
        ConfigError: the folder holds a run (say how to resume or replace it) or files accumrun did not write.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError("output.run_dir", "exists and is not a folder", str(run_dir))
    existing = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    if existing and not overwrite:
        raise ConfigError("output.run_dir", _why_taken(run_dir), str(run_dir))
    foreign = [name for name in existing if not is_run_file(name) and not name.startswith(".")]
    if foreign:
        raise ConfigError(
            "output.run_dir", f"holds files accumrun did not write ({', '.join(foreign)}); not overwriting it"
        )
    for name in existing:
        path = run_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)


def is_run_file(name: str) -> bool:
    """Whether ``name`` in a run folder is one that accumrun writes (so ``--overwrite`` may remove it)."""
    return name in RUN_FILES or _EVAL_FILE.fullmatch(name) is not None


def _why_taken(run_dir: Path) -> str:
    status = read_status(run_dir)
    if status is RunState.COMPLETED:
        return "holds a completed run; pass --overwrite to replace it, or choose another --run-dir"
    held = f"holds {'an' if status is RunState.INTERRUPTED else 'a'} {status} run" if status is not None else ""
    if status is not None and has_checkpoint(run_dir):
        return f"{held}; continue it with --resume {run_dir}, or pass --overwrite to replace it"
    if status is not None:
        return f"{held} with no checkpoint to resume; pass --overwrite to start it again"
    return "exists and is not empty; choose another --run-dir"


def require_run_folder(run_dir: Path) -> Path:
    """``run_dir``, when it holds a run (its ``run.json``): the one rule for every command that takes a run folder.

    Raises:
        ArgumentError: the folder is missing, or is not a run's.
    """
    if not (run_dir / "run.json").is_file():
        raise ArgumentError(str(run_dir), "not a run folder (no run.json)")
    return run_dir


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` has a checkpoint that ``--resume`` can continue from."""
    return any((run_dir / "checkpoints").glob("ckpt-*.npz"))


def write_labels(run_dir: Path, names: list[str]) -> None:
    """``labels.json``: the class names in the order of the model's outputs, for predictions."""
    write_text_atomically(run_dir / "labels.json", json.dumps(names, indent=1) + "\n")


def write_features(run_dir: Path, names: list[str]) -> None:
    """``features.json``: a table's feature columns in the order the model takes them, for predictions."""
    write_text_atomically(run_dir / "features.json", json.dumps(names, indent=1) + "\n")


def write_vocabulary(run_dir: Path, tokens: tuple[str, ...]) -> None:
    """``tokenizer/vocabulary.txt``: a learned vocabulary, one token per line (id order), for every later reader."""
    text = "".join(f"{token}\n" for token in tokens)
    write_atomically(run_dir / VOCABULARY_FILE, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def write_sentence_piece(run_dir: Path, model: bytes) -> None:
    """``tokenizer/sentence_piece.model``: a learned SentencePiece model, for every later reader."""
    write_atomically(run_dir / SENTENCE_PIECE_FILE, lambda temporary: temporary.write_bytes(model))


def read_sentence_piece(run_dir: Path) -> bytes | None:
    """The run's ``tokenizer/sentence_piece.model``, or None when it has none."""
    path = run_dir / SENTENCE_PIECE_FILE
    return path.read_bytes() if path.is_file() else None


def read_vocabulary(run_dir: Path) -> tuple[str, ...] | None:
    """The tokens of the run's ``tokenizer/vocabulary.txt``, or None when it has none."""
    path = run_dir / VOCABULARY_FILE
    if not path.is_file():
        return None
    # Split at newlines alone: str.splitlines would also split at a token such as U+2028.
    return tuple(path.read_text(encoding="utf-8").split("\n")[:-1])
