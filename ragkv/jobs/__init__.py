"""Batch jobs run as `python -m ragkv.jobs.NAME` (e.g. under `ray job submit`): argument parsing and output
here, the work in the compute layer."""
