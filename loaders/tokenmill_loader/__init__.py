"""tokenmill_loader: reads tokenmill token shards (no Dagster)."""
