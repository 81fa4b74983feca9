"""Decode at batch 1 against llama.cpp, same GGUF, same ~1,100-token prompt, one run (issue #48).

    python -m ragkv_research.decode_vs_llama_cpp --llama-python /tmp/llamacpp-venv/bin/python \
        --json research/results/2026-12-07/decode-vs-llama-cpp.json

llama.cpp is never a dependency of ragkv: it runs from a separate environment
(`python -m venv /tmp/llamacpp-venv && /tmp/llamacpp-venv/bin/pip install llama-cpp-python`), as a
subprocess fed LLAMA_SCRIPT. Both sides get the same system prompt, chunks and question (each through
the model's own chat template, so prompt lengths are reported for both) and greedy decoding; both ran
with 2 threads. The figure on each side is decode tokens/s = (generated - 1) / (total - time to first
token): ragkv's from the server's own timings over the SDK, llama.cpp's from its token stream.
Modes run by turns, `--repeats` times each; the median is the figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTION = "Write a long story about the people, places and dates in these documents."
SYSTEM = "You are a helpful assistant."
TARGET_TOKENS = 1100
TEMPLATE_TOKENS = 40  # the chat template, system prompt and question around the chunks

# runs inside the llama.cpp environment: argv = gguf, request JSON path, max_new_tokens, threads
LLAMA_SCRIPT = r"""
import json, sys, time
import llama_cpp
from llama_cpp import Llama
gguf, request, n_new, threads = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=gguf, n_ctx=4096, n_threads=threads, n_threads_batch=threads, n_batch=2048, verbose=False)
messages = [{"role": "system", "content": request["system"]},
            {"role": "user", "content": "\n\n".join(request["chunks"] + [request["question"]])}]
runs = []
for _ in range(request["repeats"]):
    llm.reset()
    started = time.perf_counter(); first = None; n = 0
    for piece in llm.create_chat_completion(messages=messages, max_tokens=n_new, temperature=0.0, top_k=1,
                                            stream=True):
        if piece["choices"][0]["delta"].get("content"):
            first = first or time.perf_counter()
            n += 1
    total = time.perf_counter() - started
    runs.append({"tokens": n, "ttft_s": first - started, "total_s": total,
                 "tokens_per_s": (n - 1) / (total - (first - started))})
print(json.dumps({"llama_cpp_version": llama_cpp.__version__, "runs": runs,
                  "prompt_tokens": llm.n_tokens - runs[-1]["tokens"]}))
"""


def prompt_chunks(target_tokens: int) -> list[str]:
    """Sample-document chunks (two sentences each), cycled, until the default model's prompt is ~target_tokens."""
    from ragkv.bench.load import corpus
    from transformers import AutoTokenizer

    from workers.model import resolve_model_dir

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("default"))
    pool, chunks, total = corpus(400), [], 0
    for i in range(200):  # the sample documents, labelled and cycled until long enough
        if total >= target_tokens - TEMPLATE_TOKENS:
            break
        chunks.append(f"Passage {i + 1}. {pool[i % len(pool)]}")
        total += len(tokenizer(chunks[-1])["input_ids"]) + 2
    return chunks


def ragkv_decode(chunks: list[str], max_new_tokens: int, repeats: int, kernel: str) -> dict:
    """A real `ragkv serve` (default settings, decode kernel `kernel`) answering the prompt in `full` mode, alone."""
    from client import RagKVClient
    from ragkv.bench.load import ServerProcess

    with tempfile.TemporaryDirectory(prefix="ragkv-decode-") as tmp:
        server = ServerProcess(Path(tmp), 256 << 20, ("--max-batch", "1", "--no-sequence-cache",
                                                        "--decode-kernel", kernel))
        try:
            server.wait_ready(300)
            runs = []
            with RagKVClient(f"127.0.0.1:{server.port}", timeout=600) as cl:
                cl.generate(QUESTION, chunks=chunks, system_prompt=SYSTEM, mode="full", max_new_tokens=4)  # warm-up
                for _ in range(repeats):
                    r = cl.generate(QUESTION, chunks=chunks, system_prompt=SYSTEM, mode="full",
                                    max_new_tokens=max_new_tokens)
                    n = len(r.token_ids)
                    runs.append({"tokens": n, "ttft_s": r.ttft_s, "total_s": r.total_s,
                                 "tokens_per_s": (n - 1) / (r.total_s - r.ttft_s),
                                 "prompt_tokens": r.stats.get("prompt_tokens"),
                                 "decode_kernel": r.stats.get("decode_kernel")})
            return {"runs": runs}
        finally:
            server.stop()


def llama_decode(python: str, chunks: list[str], max_new_tokens: int, repeats: int, threads: int) -> dict:
    from workers.model import default_gguf_path

    with tempfile.NamedTemporaryFile("w", suffix=".json") as request:
        json.dump({"system": SYSTEM, "chunks": chunks, "question": QUESTION, "repeats": repeats}, request)
        request.flush()
        out = subprocess.run([python, "-c", LLAMA_SCRIPT, str(default_gguf_path()), request.name,
                              str(max_new_tokens), str(threads)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    return {"tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in runs), 1),
            "ttft_s": round(statistics.median(r["ttft_s"] for r in runs), 3),
            "tokens": [r["tokens"] for r in runs]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", required=True, help="python of an environment with llama-cpp-python")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--kernels", nargs="+", default=["avx2", "int4"], help="ragkv decode kernels to run")
    args = parser.parse_args(argv)
    import torch

    chunks = prompt_chunks(TARGET_TOKENS)
    started = time.perf_counter()
    ragkv = {kernel: ragkv_decode(chunks, args.max_new_tokens, args.repeats, kernel) for kernel in args.kernels}
    llama = llama_decode(args.llama_python, chunks, args.max_new_tokens, args.repeats, args.threads)
    result = {"chunks": len(chunks), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "torch_threads": torch.get_num_threads(), "llama_cpp_threads": args.threads,
              "ragkv": {kernel: {**summary(r["runs"]), "prompt_tokens": r["runs"][-1]["prompt_tokens"],
                                 "decode_kernel_used": r["runs"][-1]["decode_kernel"]} for kernel, r in ragkv.items()},
              "llama_cpp": {**summary(llama["runs"]), "prompt_tokens": llama["prompt_tokens"],
                            "version": llama["llama_cpp_version"]},
              "elapsed_s": round(time.perf_counter() - started, 1)}
    result["ratio_ragkv_over_llama_cpp"] = {kernel: round(r["tokens_per_s"] / result["llama_cpp"]["tokens_per_s"], 2)
                                            for kernel, r in result["ragkv"].items()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
