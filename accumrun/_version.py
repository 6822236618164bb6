"""The package's version: a leaf, so that modules below the package root can name it without importing the root."""

__version__ = "0.1.0"
