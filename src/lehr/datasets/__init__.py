"""Custom Kedro datasets for lehr's artifacts; each writes atomically (temp name, then rename)."""

from lehr.datasets.branch_points_dataset import BranchPointsDataset
from lehr.datasets.branches_dataset import AnnealBranchesDataset
from lehr.datasets.checkpoint_dataset import CheckpointDataset
from lehr.datasets.corpus_dataset import CorpusDataset
from lehr.datasets.ladder_rungs_dataset import LadderRungsDataset
from lehr.datasets.path_dataset import RunDirDataset
from lehr.datasets.report_datasets import (
    AtomicCSVDataset,
    AtomicJSONDataset,
    AtomicMatplotlibDataset,
    AtomicTextDataset,
)
from lehr.datasets.shards_dataset import ShardsDataset
from lehr.datasets.task_files_dataset import TaskFilesDataset
from lehr.datasets.token_streams_dataset import TokenStreamsDataset
from lehr.datasets.tokenizer_dataset import TokenizerDataset

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
