"""The `setup` fixture for every test here: an event applier over the Atlas scenario (see applier_kit)."""

from tests.agents.applier_kit import setup  # noqa: F401 - the fixture
