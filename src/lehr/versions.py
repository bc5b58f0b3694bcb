"""The versions of the software that decides an artifact's bytes, recorded beside the code's identity.

Two runs of the same code and data make other bytes under another torch (kernels, RNG streams),
tokenizers (merges, pre-tokenization), numpy (the token arrays) or safetensors (the files), and
Python decides what the rest does. Each checkpoint, token part, token index and shard manifest
records them; reusing one made under other versions is refused as reusing one made by other code
is, unless a setting says to go on (``pretrain.resume_under_new_code``,
``tokenize.reuse_under_new_versions``), and then the record says so.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform

PACKAGES = ("torch", "tokenizers", "numpy", "safetensors")


# What decides the bytes of the data side's artifacts (token parts and their index, the shards):
# no torch or safetensors, so that a GPU machine and a CPU one encode the slices of one corpus.
DATA = ("tokenizers", "numpy")


@functools.cache
def deciding(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """{name: version} of Python and of each of ``packages`` installed here."""
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def differing(recorded: dict | None, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """What differs from the versions here, one entry per name: ``tokenizers 0.23.2 (here
    0.23.3)``. A record made before versions were recorded is itself a difference."""
    current = deciding(packages)
    if not recorded:
        return ["the versions (the record predates them)"]
    names = sorted(set(recorded) | set(current))
    return [
        f"{n} {recorded.get(n, 'absent')} (here {current.get(n, 'absent')})"
        for n in names
        if recorded.get(n) != current.get(n)
    ]
