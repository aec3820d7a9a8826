"""Housekeeping of a long-running worker: background jobs, logs, the collector, retention, shutdown."""
