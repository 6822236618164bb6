"""``data.name: image_folder``: one subfolder per class, as ``keras.utils.image_dataset_from_directory`` reads.

The files are listed at startup and decoded as they stream, so a folder bigger than memory trains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from accumrun.data.files import IMAGE_EXTENSIONS, ImageFiles
from accumrun.data.section import FileSourceConfig, ImageSourceConfig
from accumrun.data.splits import Splits
from accumrun.errors import DataError


class ImageFolderConfig(FileSourceConfig, ImageSourceConfig):
    """``name: image_folder``: one subfolder of images per class."""

    needs = {**ImageSourceConfig.needs, "path": "a folder with one subfolder of images per class"}
    name: Literal["image_folder"]


def load_image_folder(config: ImageFolderConfig, seed: int) -> Splits:
    """The files under ``data.path`` (and ``data.validation_path``, with the same classes), by class, then by path.

    Raises:
        DataError: a folder is missing, has fewer than two classes or a class without images, or their classes differ.
    """
    train, names, skipped = list_image_folder(Path(config.path), "data.path", config)
    if not config.validation_path:
        return Splits(train, class_names=names, skipped=skipped)
    test, val_names, val_skipped = list_image_folder(Path(config.validation_path), "data.validation_path", config)
    if val_names != names:
        raise DataError(
            "data.validation_path",
            f"has classes {_names(val_names)}, data.path has {_names(names)}; they must be the same",
            config.validation_path,
        )
    return Splits(train, test, class_names=names, skipped=skipped + val_skipped)


def list_image_folder(folder: Path, key: str, config: ImageFolderConfig) -> tuple[ImageFiles, list[str], int]:
    """The images in ``folder``'s class subfolders, their class names and the count of other files skipped."""
    if not folder.exists():
        raise DataError(key, "folder not found", str(folder))
    if not folder.is_dir():
        raise DataError(key, "is not a folder of class subfolders", str(folder))
    classes = sorted(entry.name for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise DataError(key, "holds no class subfolders (one subfolder of images per class)", str(folder))
    if len(classes) < 2:
        raise DataError(key, f"holds one class ({classes[0]}); classification needs at least two", str(folder))
    paths: list[str] = []
    labels: list[int] = []
    skipped = 0
    for label, name in enumerate(classes):
        for file in sorted(path for path in (folder / name).rglob("*") if path.is_file()):
            if file.suffix.lower() in IMAGE_EXTENSIONS:
                paths.append(str(file))
                labels.append(label)
            elif not file.name.startswith("."):
                skipped += 1
    if not paths:
        raise DataError(key, f"holds no images ({', '.join(IMAGE_EXTENSIONS)}) in its class subfolders", str(folder))
    # An empty subfolder would still become a class: an output the model is trained never to predict.
    present = set(labels)
    empty = [name for index, name in enumerate(classes) if index not in present]
    if empty:
        noun = "folder" if len(empty) == 1 else "folders"
        shown = ", ".join(f"{name}/" for name in empty)
        raise DataError(key, f"class {noun} {shown} {'holds' if len(empty) == 1 else 'hold'} no images", str(folder))
    return ImageFiles(np.array(paths), np.array(labels, dtype=np.int32), config.size, config.channels), classes, skipped


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:6])
    return f"[{shown}{', ...' if len(names) > 6 else ''}]"
