"""The HTTP face of a worker: gatekeeping, routes, selects, status reads and metrics."""
