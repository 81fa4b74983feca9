"""Generated gRPC stubs for ragkv.v1 (do not edit; run `python -m ragkv.tools.gen_proto`)."""
