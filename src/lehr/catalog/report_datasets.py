"""The JSON and text reports, saved whole (``AtomicSave``). The CSV and plot datasets have modules
of their own: pandas and matplotlib are imported only by a stage that writes a table or a plot."""

from kedro_datasets.json import JSONDataset
from kedro_datasets.text import TextDataset

from lehr.catalog.atomic_save import AtomicSave


class AtomicJSONDataset(AtomicSave, JSONDataset):
    pass


class AtomicTextDataset(AtomicSave, TextDataset):
    pass
