"""Regenerate datasets/digits.npz from scikit-learn's bundled copy of the UCI optical-digits data.

Usage: pip install scikit-learn && python datasets/make_digits.py

accumrun itself never imports scikit-learn; it only reads the .npz this script writes.
"""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parent / "digits.npz"


def main() -> None:
    digits = load_digits()
    # Pixels are counts 0..16, so uint8 holds them exactly; keep the file small.
    x = digits.images.astype(np.uint8)
    y = digits.target.astype(np.uint8)
    assert x.shape == (1797, 8, 8) and set(np.unique(y)) == set(range(10))
    np.savez_compressed(OUT, x=x, y=y)
    print(f"wrote {OUT}: x {x.shape} {x.dtype}, y {y.shape} {y.dtype}")


if __name__ == "__main__":
    main()
