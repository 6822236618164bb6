"""``data.feed``: whether the step gets whole batches (one transfer, one compiled call: the fast way, as long as
the batch fits) or streamed sub-batches (as darknet loads batch/subdivisions images per step: the same numbers).
``auto`` streams when the data streams from files and the batch is the whole training set, or when two input
batches (the one training and the one prefetched) would take more than a quarter of the memory available.
"""

from __future__ import annotations

import math
import os
from typing import Literal, NamedTuple

from accumrun.data.dataset import Dataset
from accumrun.errors import ConfigError
from accumrun.kinds import Feed

BUDGET_SHARE = 4
"""Two input batches may take 1/BUDGET_SHARE of the available memory before ``auto`` streams sub-batches."""


def available_memory() -> int:
    """Bytes of memory available to a new allocation: Linux's MemAvailable, or the physical memory elsewhere."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def input_bytes(dataset: Dataset, samples: int) -> int:
    """What ``samples`` samples take as stored (one byte per value for uint8 images)."""
    return samples * math.prod(dataset.sample_shape) * dataset.dtype.itemsize


class FeedChoice(NamedTuple):
    """The feed a run uses, and why, in words for the startup summary."""

    feed: Feed
    reason: str


def choose_feed(feed: Literal["auto"] | Feed, dataset: Dataset, batch_size: int, replicated: bool) -> FeedChoice:
    """The feed to use and why, in words for the startup summary; ConfigError for ``sub_batch`` with replicas."""
    batch = input_bytes(dataset, batch_size)
    size = f"input batch {batch / 2**20:,.1f} MiB" if batch >= 2**20 else f"input batch {batch / 2**10:,.1f} KiB"
    if isinstance(feed, Feed):
        if feed is Feed.SUB_BATCH and replicated:
            raise ConfigError("data.feed", "sub_batch streams on one device; use batch with distribute", feed.value)
        return FeedChoice(feed, f"{size}; data.feed: {feed.value}")
    if replicated:
        return FeedChoice(Feed.BATCH, f"{size}; replicas take whole batches")
    if dataset.streamed and batch_size == dataset.train_size:
        return FeedChoice(Feed.SUB_BATCH, f"{size}; the full batch of streamed files is never held at once")
    available = available_memory()
    if 2 * batch * BUDGET_SHARE > available:
        return FeedChoice(
            Feed.SUB_BATCH, f"{size} x 2 exceeds 1/{BUDGET_SHARE} of {available / 2**30:,.1f} GiB available"
        )
    return FeedChoice(Feed.BATCH, size)
