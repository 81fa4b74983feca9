"""The `ragkv` dispatcher and `serve` flag handling (no server started)."""

from __future__ import annotations

import pytest

from ragkv.cli import COMMANDS, build_parser, main
from ragkv.commands.serve import config_from_args


def test_subcommands_registered():
    assert {"serve", "demo", "bench", "check"} <= set(COMMANDS)


def test_serve_flags_to_config(monkeypatch):
    monkeypatch.setenv("RAGKV_TOKEN", "from-env")
    args = build_parser("serve").parse_args(["serve", "--port", "0", "--codec", "int8", "--store", "redis://h:1/0",
                                             "--workers", "ray://head:10001", "--max-queue", "3",
                                             "--memory-budget", "64M"])
    config = config_from_args(args)
    assert (config.port, config.codec, config.store_url, config.workers, config.max_queue) == \
        (0, "int8", "redis://h:1/0", "ray://head:10001", 3)
    assert config.memory_budget_bytes == 64 << 20 and config.token == "from-env"
    assert config_from_args(build_parser("serve").parse_args(["serve"])).store_url.startswith("disk:")


def test_serve_retain_memory_from_flag_and_env(monkeypatch):
    parse = build_parser("serve").parse_args
    assert config_from_args(parse(["serve"])).engine.retain_memory is True  # the default
    assert config_from_args(parse(["serve", "--no-retain-memory"])).engine.retain_memory is False
    monkeypatch.setenv("RAGKV_RETAIN_MEMORY", "off")
    assert config_from_args(parse(["serve"])).engine.retain_memory is False
    assert config_from_args(parse(["serve", "--retain-memory"])).engine.retain_memory is True  # a flag beats the env
    monkeypatch.setenv("RAGKV_RETAIN_MEMORY", "maybe")
    with pytest.raises(ValueError, match="RAGKV_RETAIN_MEMORY: .*maybe"):
        config_from_args(parse(["serve"]))


def test_the_servers_recompute_ratio_from_flag_environment_and_file(monkeypatch, tmp_path):
    """The ratio of requests that give none: the default, a config file, RAGKV_RECOMPUTE_RATIO, then the flag."""
    from dataclasses import replace

    from workers.blend import server_setting

    parse = build_parser("serve").parse_args
    assert config_from_args(parse(["serve"])).engine.blend == server_setting()
    path = tmp_path / "ragkv.toml"
    path.write_text("recompute_ratio = 0.3\n")
    assert config_from_args(parse(["serve", "--config", str(path)])).engine.blend.recompute_ratio == 0.3
    monkeypatch.setenv("RAGKV_RECOMPUTE_RATIO", "0.5")
    assert config_from_args(parse(["serve", "--config", str(path)])).recompute_ratio == 0.5
    blend = config_from_args(parse(["serve", "--recompute-ratio", "0.15"])).engine.blend
    assert blend == replace(server_setting(), recompute_ratio=0.15)  # the method and the rest stay the server's
    blend = config_from_args(parse(["serve", "--exact-from", "1"])).engine.blend
    assert blend.exact_from == 1.0 and not blend.exact  # a ratio below 1 is blended again


def test_serve_rejects_half_tls(tmp_path):
    with pytest.raises(SystemExit, match="tls"):
        main(["serve", "--tls-cert", str(tmp_path / "c.pem")])


@pytest.mark.parametrize("flags, named", [
    (["--store", "bogus://x"], "--store"),
    (["--model", "/missing/model"], "--model"),
    (["--codec", "int4", "--max-queue", "-1"], "--max-queue"),
    (["--recompute-ratio", "1.5"], "--recompute-ratio"),
    (["--exact-from", "0"], "--exact-from"),
])
def test_bad_flags_print_one_line_and_exit_2(flags, named, capsys, monkeypatch):
    monkeypatch.setattr("ragkv.server.app.serve", lambda config: pytest.fail("the server must not start"))
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ragkv serve: ") and named in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["serve", "--codec", "nope"], ["demo", "--codec", "nope"], ["serve", "--port", "x"],
                                  ["bench", "nope"], ["no-such-command"], ["serve", "--no-such-flag"],
                                  ["bench", "blend", "--settings", "nope@0.15"],
                                  ["bench", "serve", "--recompute-ratio", "1.5"],
                                  ["bench", "serve", "--recompute-ratio", "x"],
                                  ["bench", "quality", "--configs", "blend:nope@0.1"],
                                  ["calibrate", "--methods", "deviation,nope"], ["calibrate", "--ratios", "0.1,x"],
                                  ["calibrate", "--ratios", "1.5"], ["calibrate", "--target", "0"]])
def test_argparse_errors_are_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: " in err and "usage" not in err


def test_codec_flag_and_config_read_the_codec_registry():
    from kvstore.codecs import CODECS

    parser = build_parser("serve")
    for name in CODECS:
        assert config_from_args(parser.parse_args(["serve", "--codec", name])).codec == name
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--codec", "no-such-codec"])


def test_the_demo_retrieves_a_set_per_question():
    """`ragkv demo` asks each sample question over its own retrieved documents, best first, as a retriever
    would: the answer's document leads, and the sets differ between questions."""
    from ragkv.commands.demo import RETRIEVED, retrieve
    from workers.samples import sample_documents, sample_questions

    docs = list(sample_documents().values())
    sets = [tuple(retrieve(q.question, docs)) for q in sample_questions()]
    assert all(len(s) == RETRIEVED for s in sets) and len(set(sets)) > 1
    for q, retrieved in zip(sample_questions(), sets):
        assert any(q.answer.lower() in doc.lower() for doc in retrieved), q.question


@pytest.fixture(scope="module")
def unsupported_models(tmp_path_factory) -> dict[str, str]:
    """Tiny real model directories of architectures ragkv does not serve (random weights, saved by transformers)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, Phi3Config, Phi3ForCausalLM

    root = tmp_path_factory.mktemp("unsupported")
    small = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1)
    Gemma2ForCausalLM(Gemma2Config(head_dim=16, **small)).save_pretrained(root / "gemma2")
    Phi3ForCausalLM(Phi3Config(pad_token_id=0, eos_token_id=1, bos_token_id=2, **small)).save_pretrained(root / "phi3")
    return {"gemma2": str(root / "gemma2"), "phi3": str(root / "phi3")}


@pytest.mark.parametrize("command", [["serve"], ["check"], ["calibrate"], ["bench", "blend"], ["demo"]])
@pytest.mark.parametrize("architecture", ["gemma2", "phi3"])
def test_an_unsupported_architecture_is_refused_in_one_line(command, architecture, unsupported_models, capsys,
                                                            monkeypatch):
    monkeypatch.setattr("ragkv.server.app.serve", lambda config: pytest.fail("the server must not start"))
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--model", unsupported_models[architecture]])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"architecture {architecture!r}" in err and "supported: gemma3_text, llama" in err


def test_prompt_template_is_a_file_from_flag_or_environment(tmp_path, monkeypatch, capsys):
    """--prompt-template FILE and RAGKV_PROMPT_TEMPLATE=FILE name the same thing: a file the engine reads."""
    template = tmp_path / "plain.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    parse = build_parser("serve").parse_args
    assert config_from_args(parse(["serve", "--prompt-template", str(template)])).engine.prompt_template == str(template)
    monkeypatch.setenv("RAGKV_PROMPT_TEMPLATE", str(template))
    assert config_from_args(parse(["serve"])).engine.prompt_template == str(template)
    (tmp_path / "empty.jinja").write_text(" \n")
    for bad in (tmp_path / "empty.jinja", tmp_path / "missing.jinja"):
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--prompt-template", str(bad)])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--prompt-template" in err and bad.name in err
