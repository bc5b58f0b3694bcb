"""evaluate stage."""

from lehr.pipelines.evaluate.pipeline import create_pipeline

__all__ = ["create_pipeline"]
