"""Errors whose message is the whole story: what is wrong, in which file, and what to do.

lehr raises a ``ValueError`` (or ``FileNotFoundError``) for every bad input and an ``Explained``
error for what it will not or cannot do (resume a checkpoint it cannot trust, write a folder
another run holds, reach a network that is not there). The
commands print such an error as one line and exit 2; anything else is a bug and keeps its
traceback. ``LEHR_TRACEBACK=1`` shows the traceback of every error.
"""

from __future__ import annotations

import os

EXIT = 2  # the exit status of an explained error (argparse's and click's for a usage error too)


class Explained(Exception):
    """Mixed into lehr's errors that are not bad input (a refused resume, a busy folder, no network):
    their message says what happened and what to do."""


# Kedro's own: a parameter that fails its dataclass (the message is lehr's check) and a dataset
# that cannot load (the message names the dataset and carries lehr's reason).
_KEDRO = ("ParameterValidationError", "DatasetError")


def explained(error: BaseException) -> str | None:
    """The message of the first explained error in ``error``'s chain, or None (show the traceback)."""
    if os.environ.get("LEHR_TRACEBACK") == "1":
        return None
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (ValueError, FileNotFoundError, FileExistsError, Explained)) or (
            type(error).__name__ in _KEDRO and type(error).__module__.startswith("kedro")
        ):
            return str(error).strip()
        error = error.__cause__ or error.__context__
    return None
