"""The seam: what the worker and the arbiter both speak, and the only part of the arbiter a worker
imports besides the store (for the legacy transport). Verdicts, languages, worker ids, delivery
outcomes, problem digests, comparer specs, the config-file helpers and the log format. Imports nothing
else of arbiter/ or worker/ (import-linter contract in pyproject.toml)."""
