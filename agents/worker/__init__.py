"""The worker: what one running freshplan process holds (`runtime`) and how it is wired (`build`)."""

from agents.worker.build import build_worker
from agents.worker.runtime import Worker

__all__ = ["Worker", "build_worker"]
