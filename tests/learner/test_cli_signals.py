"""The CLI's stop signals end a `python -m` process with its own exit code, wherever they land."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.signals import default_stop_signals

# A signal that lands while exec()'d code runs (as when a late import builds a dataclass) and is
# caught: the process must still exit with the code it returns, not die by SIGINT.
CHILD = textwrap.dedent(
    """
    import sys
    from clusterenv.learner.tools.cli import stop_on_signals

    def main() -> int:
        stop_on_signals()
        try:
            exec("import os, signal\\nos.kill(os.getpid(), signal.{sig})\\nwhile True: pass")
        except KeyboardInterrupt:
            return 130
        return 0

    if __name__ == "__main__":
        sys.exit(main())
    """
)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_signal_inside_exec_code_still_exits_130_under_python_m(tmp_path: Path, sig):
    (tmp_path / "child_under_m.py").write_text(CHILD.format(sig=sig))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-m", "child_under_m"], env=env, capture_output=True, text=True,
        timeout=60, preexec_fn=default_stop_signals,
    )  # fmt: skip
    assert proc.returncode == 130, proc.stderr


def test_an_ignored_stop_signal_stays_ignored(tmp_path: Path):
    code = (
        "import os, signal\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "from clusterenv.learner.tools.cli import stop_on_signals\n"
        "stop_on_signals()\n"
        "os.kill(os.getpid(), signal.SIGHUP)\n"
        "print('still here')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "still here" in proc.stdout, proc.stderr
