"""Ending a child process: SIGTERM, a bounded wait, then SIGKILL (a child must never outlive its owner)."""

from __future__ import annotations

import subprocess


def end_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Terminate `proc` and wait up to `timeout` seconds for it; kill it if it is still there."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)
