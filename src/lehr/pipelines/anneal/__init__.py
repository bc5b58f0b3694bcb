"""anneal stage."""

from lehr.pipelines.anneal.pipeline import create_pipeline

__all__ = ["create_pipeline"]
