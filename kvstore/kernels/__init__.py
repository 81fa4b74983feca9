"""GPU hot-path kernels (Triton) with the torch reference as spec and CPU default.

Import the ops from kvstore.kernels.dispatch; triton is imported lazily on first
Triton-backed call, never by `import kvstore` or `import kvstore.kernels`.
"""
