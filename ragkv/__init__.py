"""ragkv application package: CLI, gRPC server and benchmarks. Imports nothing heavy."""

__version__ = "0.1.0"
