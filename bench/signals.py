"""Child processes that see stop signals as a terminal sends them (the rig's processes, CLIs under test)."""

from __future__ import annotations

import signal


def default_stop_signals() -> None:
    """preexec_fn: SIGINT and SIGHUP back to their defaults in the child. A shell starting pytest
    in the background (or under nohup) makes them ignored, and ignored signals are inherited: a
    CLI under test must see them as a terminal sends them."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
