"""pretrain_stable stage."""

from lehr.pipelines.pretrain_stable.pipeline import create_pipeline

__all__ = ["create_pipeline"]
