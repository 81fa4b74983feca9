"""Developer tools run as `python -m ragkv.tools.NAME` (set-up helpers, code generation)."""
