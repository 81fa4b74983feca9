"""`ragkv` subcommands: one module each, with `add_arguments(parser)` (optional) and `run(args) -> int | None`."""
