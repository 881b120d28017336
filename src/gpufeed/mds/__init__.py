"""Datasets beyond one node: MosaicML Streaming (MDS shards) as gpufeed's engine."""
