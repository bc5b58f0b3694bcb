"""The one rule for a name a user gives that becomes a folder (an anneal branch, a soup, a run):
a plain folder name, so that it can only ever name a folder inside the one lehr writes it into.
"""

from __future__ import annotations

import re

MAX_LENGTH = 100  # well under every filesystem's 255 bytes, with room for lehr's "-<hash>" suffixes
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
RULE = (
    f"must be a plain folder name: 1 to {MAX_LENGTH} letters, digits, '-', '_' or '.', starting with a "
    "letter or digit, without '..'"
)


def is_folder_name(name: str) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_LENGTH
        and _NAME.fullmatch(name) is not None
        and ".." not in name
    )
