"""Custom Kedro datasets for lehr's artifacts; each writes atomically (temp name, then rename).

Kedro's catalog names them as ``lehr.catalog.<Name>``. Each is imported when the catalog first
asks for it, not all at once: a stage's process loads only the datasets it reads or writes, so the
tokenize stage never imports matplotlib, pandas or torch for another stage's reports.
"""

import importlib

_HOMES = {
    "AnnealBranchesDataset": "branches_dataset",
    "AtomicCSVDataset": "csv_dataset",
    "AtomicJSONDataset": "report_datasets",
    "AtomicMatplotlibDataset": "plot_dataset",
    "AtomicTextDataset": "report_datasets",
    "BranchPointsDataset": "branch_points_dataset",
    "CheckpointDataset": "checkpoint_dataset",
    "CorpusDataset": "corpus_dataset",
    "LadderRungsDataset": "ladder_rungs_dataset",
    "RunDirDataset": "path_dataset",
    "ShardsDataset": "shards_dataset",
    "TaskFilesDataset": "task_files_dataset",
    "TokenStreamsDataset": "token_streams_dataset",
    "TokenizerDataset": "tokenizer_dataset",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
