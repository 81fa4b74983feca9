"""The plain-torch forward equals transformers' own forward and generate."""

import torch

from workers.cache import KVCache
from workers.generate import SamplingParams, decode
from workers.prompt import build_prompt


def test_forward_matches_transformers(runner):
    ids = runner.tokenize("Paris is the capital of France. The Seine flows through it. " * 4)
    x = torch.tensor(ids)
    with torch.inference_mode():
        reference = runner.model(x[None]).logits[0].float()
    mine = runner.forward(x, torch.arange(len(ids)), KVCache.empty(runner.shape.num_layers), last_only=False)
    assert torch.allclose(mine, reference, atol=1e-4, rtol=1e-4)


def test_chunk_kv_shape_and_values(runner):
    ids = runner.tokenize("A short chunk about copper kettles.")
    kv = runner.chunk_kv(ids)
    shape = runner.shape
    assert kv.keys.shape == (shape.num_layers, shape.num_kv_heads, len(ids), shape.head_dim)
    with torch.inference_mode():
        cache = runner.model(torch.tensor(ids)[None], use_cache=True).past_key_values
    assert torch.allclose(kv.keys[3], cache.layers[3].keys[0], atol=1e-5)
    assert torch.allclose(kv.values[7], cache.layers[7].values[0], atol=1e-5)


def test_greedy_decode_equals_transformers_generate(runner):
    chunks = [runner.tokenize("The capital of Frobnia is Lindorf, founded by Osric Vale."),
              runner.tokenize("Zorblat has two moons, Tiv and Rel.")]
    layout = build_prompt(runner.tokenizer, "", chunks, "Who founded Lindorf?")
    x = torch.tensor(layout.token_ids)
    cache = KVCache.empty(runner.shape.num_layers)
    logits = runner.forward(x, torch.arange(len(x)), cache)
    mine = list(decode(runner, cache, logits, len(x), SamplingParams(max_new_tokens=24)))
    with torch.inference_mode():
        reference = runner.model.generate(x[None], max_new_tokens=24, do_sample=False)[0, len(x):].tolist()
    reference = [t for t in reference if t not in runner.stop_token_ids]
    assert mine == reference[: len(mine)] and len(mine) == len(reference)


def test_prompt_layout_tokenizes_chunks_independently(runner):
    a, b = runner.tokenize("First chunk."), runner.tokenize("Second chunk.")
    one = build_prompt(runner.tokenizer, "Be brief.", [a, b], "Question?")
    two = build_prompt(runner.tokenizer, "Be brief.", [b, a], "Question?")
    (s1, e1), (s2, e2) = one.chunk_spans
    assert one.token_ids[s1:e1] == a and one.token_ids[s2:e2] == b
    assert two.token_ids[two.chunk_spans[1][0]:two.chunk_spans[1][1]] == a
    assert one.prefix_ids == two.prefix_ids
    text = runner.tokenizer.decode(one.token_ids)
    assert "First chunk.\n\nSecond chunk.\n\nQuestion?" in text and "Be brief." in text


def test_sliding_windows_are_read_from_the_config():
    """Gemma 3 lists its layer types; a Mistral config's window covers every layer; Qwen2's is off unless asked."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

    from workers.runner import sliding_windows

    assert sliding_windows(MistralConfig(num_hidden_layers=2, sliding_window=4096)) == (4096, 4096)
    assert sliding_windows(LlamaConfig(num_hidden_layers=2)) == (None, None)
    assert sliding_windows(Qwen2Config(num_hidden_layers=2, sliding_window=512)) == (None, None)
    gemma = Gemma3TextConfig(num_hidden_layers=6, sliding_window=512)
    assert sliding_windows(gemma) == (512,) * 5 + (None,)
