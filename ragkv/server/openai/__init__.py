"""The OpenAI-compatible HTTP API (`ragkv serve --http-port N`): FastAPI on uvicorn, in the gRPC server's
process, on the same engine, token, admission queue and metrics. docs/openai.md describes it."""
