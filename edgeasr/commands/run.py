"""`edgeasr [--config FILE] [--input FILE] [--set KEY=VALUE]`: run the daemon (the default command)."""

from __future__ import annotations

import argparse
import logging
import sys

from edgeasr.commands.common import load

log = logging.getLogger(__name__)


def setup_logging(level: str) -> None:
    """journald when systemd started us (structured fields), else stderr."""
    from edgeasr.notify import journal_handler

    handler = journal_handler() or logging.StreamHandler(sys.stderr)
    if isinstance(handler, logging.StreamHandler):
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def main(args: argparse.Namespace) -> int:
    from edgeasr.config_warnings import config_warnings
    from edgeasr.daemon import build, bundle_facts
    from edgeasr.models.default import open_bundle

    cfg = load(args)
    setup_logging(cfg.log.level)
    bundle = open_bundle(cfg)
    for line in config_warnings(cfg, bundle_facts(cfg, bundle)):  # as `edgeasr check` shows them
        log.warning("%s", line)
    daemon = build(cfg, bundle)
    if args.config is not None:
        daemon.reload_config = lambda: load(args)
    return daemon.run()
