"""shard stage."""

from lehr.pipelines.shard.pipeline import create_pipeline

__all__ = ["create_pipeline"]
