"""Custom Kedro datasets for lehr's artifacts; each writes atomically (temp name, then rename)."""

from lehr.datasets.corpus_dataset import CorpusDataset
from lehr.datasets.shards_dataset import ShardsDataset
from lehr.datasets.token_streams_dataset import TokenStreamsDataset
from lehr.datasets.tokenizer_dataset import TokenizerDataset

__all__ = ["CorpusDataset", "ShardsDataset", "TokenStreamsDataset", "TokenizerDataset"]
