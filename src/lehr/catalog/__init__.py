"""Custom Kedro datasets for lehr's artifacts; each writes atomically (temp name, then rename)."""

from lehr.catalog.branch_points_dataset import BranchPointsDataset
from lehr.catalog.branches_dataset import AnnealBranchesDataset
from lehr.catalog.checkpoint_dataset import CheckpointDataset
from lehr.catalog.corpus_dataset import CorpusDataset
from lehr.catalog.ladder_rungs_dataset import LadderRungsDataset
from lehr.catalog.path_dataset import RunDirDataset
from lehr.catalog.report_datasets import (
    AtomicCSVDataset,
    AtomicJSONDataset,
    AtomicMatplotlibDataset,
    AtomicTextDataset,
)
from lehr.catalog.shards_dataset import ShardsDataset
from lehr.catalog.task_files_dataset import TaskFilesDataset
from lehr.catalog.token_streams_dataset import TokenStreamsDataset
from lehr.catalog.tokenizer_dataset import TokenizerDataset

__all__ = [
    "AnnealBranchesDataset",
    "AtomicCSVDataset",
    "AtomicJSONDataset",
    "AtomicMatplotlibDataset",
    "AtomicTextDataset",
    "BranchPointsDataset",
    "CheckpointDataset",
    "CorpusDataset",
    "LadderRungsDataset",
    "RunDirDataset",
    "ShardsDataset",
    "TaskFilesDataset",
    "TokenStreamsDataset",
    "TokenizerDataset",
]
