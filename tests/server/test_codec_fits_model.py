"""A codec that cannot hold the loaded model's KV is refused at start-up, naming the codec and the reason:
the rotated `h` codecs need a power-of-two head_dim (a tiny random Llama with head_dim 48 here)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from kvstore.codecs import CodecError
from ragkv.cli import main
from workers.engine import Engine, EngineConfig
from workers.model import resolve_model_dir


@pytest.fixture(scope="module")
def head_dim_48(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("default"))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_engine_refuses_a_rotated_codec_for_head_dim_48(head_dim_48, tmp_path):
    with pytest.raises(CodecError, match="power-of-two head_dim"):
        Engine(EngineConfig(model=head_dim_48, store=f"disk:{tmp_path / 'a'}", codec="wk4v3"))
    engine = Engine(EngineConfig(model=head_dim_48, store=f"disk:{tmp_path / 'b'}", codec="int8"))
    try:
        assert engine.ingest(["A short chunk of text."])[0].num_tokens > 0
    finally:
        engine.close()


def test_serve_reports_it_as_one_line_and_exit_2(head_dim_48, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ragkv.server.app.signal.signal", lambda *args: None)  # keep pytest's own handlers
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--model", head_dim_48, "--codec", "wk4v3", "--port", "0", "--store", f"disk:{tmp_path}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ragkv serve: --codec: ") and "power-of-two" in err[-1]
