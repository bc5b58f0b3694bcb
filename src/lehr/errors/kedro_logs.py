"""Kedro's logs around an error lehr says itself: held back, or dropped, so the error is said once."""

from __future__ import annotations

import contextlib
import logging
import warnings

# Kedro's parameter validation logs each parameter that fails its dataclass, then raises the same
# text: lehr says it once (``quiet_errors``).
VALIDATOR = "kedro.validation.parameter_validator"
# Kedro's own words on a failed node: the error again, and a hint to resume with --from-nodes
# (lehr's stages resume by themselves).
NODE_FAILURE = (
    "kedro.pipeline.node",
    "kedro.runner.sequential_runner",
    "kedro.runner.parallel_runner",
    "kedro.runner.thread_runner",
)


@contextlib.contextmanager
def held_back(names: tuple[str, ...]):
    """Hold back the warnings and errors of the loggers ``names`` meanwhile, into the list it
    yields: an explained error is said in one line and they go; any other error ``release``s them
    before its traceback."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        held.append(record)
        return False

    loggers = [logging.getLogger(n) for n in names]
    for logger in loggers:
        logger.addFilter(hold)
    try:
        yield held
    finally:
        for logger in loggers:
            logger.removeFilter(hold)


def release(held: list[logging.LogRecord]) -> None:
    for record in held:
        logging.getLogger(record.name).handle(record)


def quiet_config_loader() -> None:
    """Kedro's config loader registers its resolvers with an omegaconf call that omegaconf 2.4 (the
    one hydra-core pins) warns about at every load: Kedro's to change, nothing a user can act on."""
    warnings.filterwarnings(
        "ignore", message=r"register_new_resolver\(\) is deprecated", category=UserWarning
    )


@contextlib.contextmanager
def quiet_errors(logger_name: str):
    """Drop the ERROR records of logger ``logger_name`` meanwhile (for a logger whose errors are
    raised too, and said by lehr); its other records, and every other logger's, pass."""

    def keep(record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR

    logger = logging.getLogger(logger_name)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)
