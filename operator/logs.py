"""The operator's log says what changed, not that the periodic resync ran again."""

from __future__ import annotations

import logging
import re

# kopf's message for a handler, timer or activity that returned: "Timer 'reconcile' succeeded."
HANDLER_SUCCEEDED = re.compile(r"\w+ '[^']*' succeeded\.")
KOPF_OBJECTS = "kopf.objects"


class DemoteHandlerSuccesses(logging.Filter):
    """kopf logs every handler run that succeeds at INFO on `kopf.objects`, and no setting
    changes that (`settings.posting.level` is for Events): with the resync timer that is a line
    per SpecDeployment every 10 s. Those become DEBUG; failures and everything else keep their
    level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and HANDLER_SUCCEEDED.fullmatch(record.getMessage()):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def demote_handler_successes() -> None:
    """Install the filter on kopf's per-object logger (once)."""
    logger = logging.getLogger(KOPF_OBJECTS)
    if not any(isinstance(f, DemoteHandlerSuccesses) for f in logger.filters):
        logger.addFilter(DemoteHandlerSuccesses())
