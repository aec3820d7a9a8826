"""How long the Faust group consumer's fetches wait on the broker: a setting Faust hard-codes to 1.5 s."""

from __future__ import annotations

from faust.transport.drivers import aiokafka as driver

DEFAULT_MS = 1500  # Faust 0.15.3's value (`AIOKafkaConsumerThread._create_worker_consumer`)


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    """Faust's consumer thread with the fetch wait of `set_fetch_wait` (Tansu holds every fetch that long)."""

    fetch_wait_ms = DEFAULT_MS

    def _create_worker_consumer(self, transport):  # noqa: ANN001 - Faust's signature
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start() when it builds its fetcher, so set before the start.
        consumer._fetch_max_wait_ms = self.fetch_wait_ms
        return consumer


def set_fetch_wait(ms: int) -> None:
    """Make every Faust group consumer created from now on in this process long-poll for `ms` at most.

    Faust has no setting for it; a process runs one app, so the value is the process's.
    """
    if ms < 0:
        raise ValueError("a fetch wait is a number of milliseconds, 0 or more")
    _ConsumerThread.fetch_wait_ms = int(ms)
    driver.Consumer._new_consumer_thread = _new_consumer_thread


def fetch_wait() -> int:
    """The fetch wait Faust's group consumers get in this process."""
    return _ConsumerThread.fetch_wait_ms if driver.Consumer._new_consumer_thread is _new_consumer_thread \
        else DEFAULT_MS


def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:  # noqa: ANN001 - bound as Faust's method
    return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)
