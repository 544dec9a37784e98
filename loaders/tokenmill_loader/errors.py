"""Errors raised by tokenmill_loader (defined with the format they guard: tokenmill_loader.format)."""

from .format import DatasetError

__all__ = ["DatasetError"]
