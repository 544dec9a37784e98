"""tokenmill: the plain-Python stage functions behind the Dagster assets (no Dagster import here)."""
