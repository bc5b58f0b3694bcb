"""ladder_rung stage."""

from lehr.pipelines.ladder_rung.pipeline import create_pipeline

__all__ = ["create_pipeline"]
