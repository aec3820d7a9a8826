"""Kafka wiring: settings, the embedded broker, the Faust app and its topics."""
