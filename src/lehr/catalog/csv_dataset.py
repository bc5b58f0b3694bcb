"""CSV reports (pandas), saved whole (``AtomicSave``)."""

from kedro_datasets.pandas.csv_dataset import CSVDataset

from lehr.catalog.atomic_save import AtomicSave


class AtomicCSVDataset(AtomicSave, CSVDataset):
    pass
