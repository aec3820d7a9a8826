"""Wire contracts: JSON Schemas per topic, the matching records, and validation."""
