"""Helpers every stage shares: record JSONL and atomic files, process fan-out, progress lines."""
