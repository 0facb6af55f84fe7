"""`edgeasr [--config FILE] [--input FILE] [--set KEY=VALUE]`: run the daemon (the default command)."""

from __future__ import annotations

import argparse
import logging
import sys

from edgeasr.commands.common import load
from edgeasr.config import Config

# The start may take this long when the embedded default must be built first (the package's
# postinst builds it, so only a removed state directory gets here): several times the build's
# estimated time on a Raspberry Pi 5 (packaging/README.md, "The first start").
PREPARE_START_BUDGET_S = 900

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
    extend_start_to_prepare(cfg)
    bundle = open_bundle(cfg)
    for line in config_warnings(cfg, bundle_facts(cfg, bundle)):  # as `edgeasr check` shows them
        log.warning("%s", line)
    daemon = build(cfg, bundle)
    if args.config is not None:
        daemon.reload_config = lambda: load(args)
    return daemon.run()


def extend_start_to_prepare(cfg: Config) -> None:
    """Tell systemd the start takes longer when the embedded default is not prepared yet: its
    build may outlast the unit's TimeoutStartSec= on a slow machine."""
    from edgeasr.models.default import prepared_default
    from edgeasr.notify import SystemdNotifier

    if cfg.model.path is None and prepared_default(cfg.state_dir) is None:
        SystemdNotifier().notify(f"EXTEND_TIMEOUT_USEC={PREPARE_START_BUDGET_S * 1_000_000}\n"
                                 "STATUS=preparing the default model bundle (first use)")
