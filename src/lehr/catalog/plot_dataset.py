"""Plots (matplotlib figures as PNG), saved whole (``AtomicSave``)."""

from kedro_datasets.matplotlib.matplotlib_dataset import MatplotlibDataset

from lehr.catalog.atomic_save import AtomicSave


class AtomicMatplotlibDataset(AtomicSave, MatplotlibDataset):
    pass
