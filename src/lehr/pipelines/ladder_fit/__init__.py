"""ladder_fit stage."""

from lehr.pipelines.ladder_fit.pipeline import create_pipeline

__all__ = ["create_pipeline"]
