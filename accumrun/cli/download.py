"""``accumrun download``: a dataset's IDX files fetched, verified and written atomically."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import click

from accumrun.cli.group import Command
from accumrun.cli.options import PathToWrite
from accumrun.data.registry import DOWNLOADABLE


def _url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A URL that urllib can fetch from: one without a scheme is a usage error, whatever the mirror holds."""
    if value is not None and urllib.parse.urlsplit(value).scheme not in ("http", "https", "ftp", "file"):
        raise click.BadParameter(f"{value!r} is not an http://, https://, ftp:// or file:// URL", ctx, param)
    return value


@click.command(cls=Command)
@click.argument("dataset", type=click.Choice(DOWNLOADABLE))
@click.option(
    "--to", "folder", type=PathToWrite(file_okay=False), help="Folder for the files [default: datasets/NAME]."
)
@click.option(
    "--base-url",
    callback=_url,
    help="Fetch from this mirror (a URL or a local http server) instead of the official source.",
)
def download(dataset: str, folder: str | None, base_url: str | None) -> None:
    """Download the four IDX files of DATASET, verify their checksums and write them atomically."""
    from accumrun.data.arrays import DATASETS_DIR
    from accumrun.data.download import download_dataset

    target = Path(folder) if folder else DATASETS_DIR / dataset
    download_dataset(dataset, target, base_url=base_url, echo=click.echo)
    click.echo(f"{dataset} is ready in {target}")
