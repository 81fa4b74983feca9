"""The quality suite: held-out split discipline, checkable answers, exact configs, the quick CLI run."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from ragkv.bench.quality.configs import BlendCodec, CodecOnly, Eviction, Reuse, Shift, parse_config
from ragkv.bench.quality.families import FAMILIES, answer_found
from ragkv.bench.quality.pools import POOLS
from ragkv.bench.quality.prompts import SIZES, make_prompts
from workers.blend import BlendConfig


def count_words(text: str) -> int:  # a tokenizer-free stand-in: the prompt shapes need only a count
    return len(text.split()) * 4 // 3


@pytest.fixture(scope="module")
def both_splits():
    return {split: make_prompts(split, count_words, per_family=6, sizes=(500, 1100)) for split in POOLS}


def test_splits_share_no_prompt_and_no_vocabulary(both_splits):
    dev, test = both_splits["dev"], both_splits["test"]
    assert len(dev) == len(test) == len(FAMILIES) * 6 * 2
    prompt_text = lambda p: (p.system_prompt, p.chunks, p.question)  # noqa: E731
    assert not {prompt_text(p) for p in dev} & {prompt_text(p) for p in test}
    assert not {c for p in dev for c in p.chunks} & {c for p in test for c in p.chunks}
    assert not {p.question for p in dev} & {p.question for p in test}
    for f in fields(POOLS["dev"]):
        a, b = getattr(POOLS["dev"], f.name), getattr(POOLS["test"], f.name)
        a, b = (set(a), set(b)) if isinstance(a, tuple) else ({a}, {b})
        assert not a & b, f"pool field {f.name} shared by dev and test: {a & b}"


def test_prompts_are_deterministic():
    assert make_prompts("test", count_words, per_family=2) == make_prompts("test", count_words, per_family=2)


def test_every_family_has_a_checkable_answer(both_splits):
    for prompts in both_splits.values():
        for p in prompts:
            text = " ".join((p.system_prompt, *p.chunks))
            assert p.answers and all(answer_found(a, text) for a in p.answers), (p.family, p.answers)
            assert p.correct("Answer: " + " and ".join(p.answers) + ".")
            assert not p.correct("I do not know.")
            if p.answers[0].isdigit():  # a longer number that merely contains the code is wrong
                assert not p.correct("1" + p.answers[0] + "1")


def test_positions_and_depths_are_swept(both_splits):
    prompts = [p for p in both_splits["dev"] if p.family.startswith("single_needle")]
    assert {p.position for p in prompts} == {"first", "middle", "last"}
    assert len({p.depth for p in prompts}) >= 2


def test_every_three_prompts_cover_every_position_and_depth():
    """A short run must not sit at one depth: any 3 consecutive prompts of a family cover all positions
    and depths, any 9 all pairs (the old order put the standard run's facts at depth 0.1, 0.1, 0.1, 0.5)."""
    from ragkv.bench.quality.prompts import DEPTHS, POSITIONS, placement

    for start in range(0, 18, 3):
        block = [placement(i) for i in range(start, start + 3)]
        assert {p for p, _ in block} == set(POSITIONS) and {d for _, d in block} == set(DEPTHS)
    assert len({placement(i) for i in range(9)}) == 9
    prompts = make_prompts("test", count_words, ["single_needle"], per_family=4)
    assert sorted(p.depth for p in prompts) == [0.1, 0.5, 0.5, 0.9]


def test_prompt_sizes_reach_their_targets(runner):
    count = lambda text: len(runner.tokenize(text))  # noqa: E731
    from ragkv.bench.quality.evaluate import PromptContext

    for size in (500, 1100):
        for p in make_prompts("dev", count, ["multi_key", "table"], per_family=1, sizes=(size,)):
            n = PromptContext(runner, p, "fp16", []).layout.num_tokens
            assert 0.8 * size <= n <= 1.1 * size, (p.family, size, n)
            assert len(p.chunks) == SIZES[size][0]


def test_config_names_parse_and_bad_names_are_rejected():
    assert isinstance(parse_config("reuse"), Reuse) and parse_config("reuse").shift is False
    shift = parse_config("shift")  # the shift mode: reuse after the context drift
    assert isinstance(shift, Shift) and shift.reuse and shift.shift
    assert parse_config("shift+alone").form == "alone" and parse_config("shift+alone").shift
    assert parse_config("blend@0.3").blend_config().recompute_ratio == 0.3
    assert isinstance(parse_config("blend+codec:int4@0.15"), BlendCodec)
    assert parse_config("codec:int4").codec == "int4" and isinstance(parse_config("codec:int4"), CodecOnly)
    evict = parse_config("policy:snapkv@0.2:noprot")
    assert isinstance(evict, Eviction) and evict.budget == 0.2 and not evict.protect
    assert parse_config("policy:tova@64").budget == 64
    for bad in ("bogus", "blend@1.5", "codec", "policy:snapkv", "full@0.3", "reuse:x", "shift@0.1", "shift:x"):
        with pytest.raises(ValueError):
            parse_config(bad)


def test_exact_configs_agree_with_full(runner):
    """blend at ratio 1 is a full prefill and fp16 codec-only is lossless at this precision: agreement 1."""
    from ragkv.bench.quality.evaluate import evaluate_prompt

    count = lambda text: len(runner.tokenize(text))  # noqa: E731
    configs = [parse_config(n) for n in ("full", "blend@1.0", "codec:fp16", "reuse", "policy:adakv@0.3")]
    for p in make_prompts("dev", count, ["cross_chunk"], per_family=1, sizes=(500,)):  # a fact across a boundary
        out = evaluate_prompt(runner, p, configs, codec="int4")
        assert out["blend@1.0"].agree and out["codec:fp16"].agree, p.family
        assert out["blend@1.0"].kl < 1e-3 and out["codec:fp16"].kl < 1e-2
        assert out["reuse"].kl > 1e-3  # reuse really differs: the comparison can fail
        # the cache really shrinks to the budget: adakv's unequal heads are packed, not padded
        assert out["full"].kv_bytes == out["blend@1.0"].kv_bytes == 1.0
        assert 0.28 < out["policy:adakv@0.3"].kv_bytes < 0.32


def test_quick_run_writes_the_contract_json_and_plots(runner, tmp_path, capsys):
    """`ragkv bench quality --quick --families ... --answer-tokens 6 --configs reuse blend@1.0 --json OUT --plots DIR`,
    in process (the session's model is reused)."""
    from ragkv.cli import main

    out, plots = tmp_path / "quality.json", tmp_path / "plots"
    # two families (merge needs two), short answers and three configs (the quick preset's seven: +12 s) keep this
    # smoke test cheap (all 15 families: 140 s): the JSON, plots, report and merge do not depend on how many
    # families or configs there are or how long the answers are; blend@1.0 (exact) is checked, reuse (lossy) is not
    families = ["single_needle", "shared_attribute"]
    assert main(["bench", "quality", "--quick", "--families", ",".join(families), "--answer-tokens", "6",
                 "--configs", "reuse", "blend@1.0",
                 "--json", str(out), "--plots", str(plots), "--report", str(tmp_path / "q.md")]) == 0
    capsys.readouterr()
    result = json.loads(out.read_text())
    assert result["split"] == "dev" and result["available_splits"] == ["dev", "test"] and result["answer_tokens"] == 6
    assert sorted(result["families"]) == sorted(families)
    for data in result["families"].values():
        assert data["n"] >= 1 and data["prompt_tokens"] > 0
        for metric in ("accuracy", "agreement_vs_full", "kl_vs_full", "kv_bytes_vs_full"):
            assert set(data[metric]) == set(result["configs"])
        assert data["agreement_vs_full"]["full"] == 1.0 and data["agreement_vs_full"]["blend@1.0"] == 1.0
        for name in result["configs"]:  # the per-prompt outcomes paired comparisons read are the accuracies
            correct = data["per_prompt"]["correct"][name]
            assert len(correct) == data["n"] and sum(correct) / len(correct) == pytest.approx(data["accuracy"][name])
    assert any(p.endswith(".png") and Path(p).stat().st_size > 0 for p in result["plots"])
    report = (tmp_path / "q.md").read_text()
    assert "## single_needle" in report and "| config vs `full` |" in report
    _check_merge_gives_back_the_whole_run(result, tmp_path)


def test_answer_tokens_override_every_familys_answer_length(runner):
    """--answer-tokens N: each answer is at most N tokens (the family's own limit is 24 here)."""
    from ragkv.bench.quality.suite import run

    result = run(families=["single_needle"], per_family=1, sizes=(500,), configs=["full"], answer_tokens=3,
                 progress=False)
    assert result["answer_tokens"] == 3
    text = result["answers"]["single_needle"][0]["full"]
    assert 0 < len(runner.tokenize(text)) <= 3


def _check_merge_gives_back_the_whole_run(result, tmp_path):
    """Two runs over disjoint families merge into the run over all of them (python -m ragkv.bench.quality)."""
    from ragkv.bench.quality.__main__ import main as quality_main

    names = sorted(result["families"])
    paths = []
    for i, half in enumerate((names[::2], names[1::2])):
        part = {**result, "families": {n: result["families"][n] for n in half}, "overall": {}, "prompts": len(half)}
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_text(json.dumps(part))
    merged_path = tmp_path / "merged.json"
    assert quality_main(["merge", *map(str, paths), "--json", str(merged_path)]) == 0
    merged = json.loads(merged_path.read_text())
    assert merged["families"] == result["families"] and merged["prompts"] == len(names)
    for metric, values in result["overall"].items():
        assert merged["overall"][metric] == pytest.approx(values)
    with pytest.raises(SystemExit) as error:  # the same family twice is refused
        quality_main(["merge", str(paths[0]), str(paths[0]), "--json", str(merged_path)])
    assert error.value.code == 2


def test_near_duplicate_chunks_overlap_and_hold_one_code(both_splits):
    for p in (p for p in both_splits["dev"] if p.family == "near_duplicate"):
        holders = [i for i, c in enumerate(p.chunks) if answer_found(p.answers[0], c)]
        assert 1 <= len(holders) <= 2 and holders == list(range(holders[0], holders[0] + len(holders)))
        for a, b in zip(p.chunks, p.chunks[1:]):  # chunk i's second half opens chunk i+1
            assert a[len(a) // 2 + 40:] in b, p.index


def test_shift_flags_parse_and_other_flags_are_rejected():
    assert parse_config("blend:deviation@0.15:shift").blend_config().context_drift is True
    assert parse_config("blend:deviation@0.15:noshift").blend_config().context_drift is False
    assert parse_config("blend+lead:deviation@0.3:noshift").blend_config().context_drift is False
    with pytest.raises(ValueError, match="shift"):
        parse_config("blend@0.15:bogus")
    with pytest.raises(ValueError, match="shift"):
        parse_config("blend@0.15:drift")  # the key-drift repair moved to research/


def test_chunk_form_configs_parse():
    lead = parse_config("blend+lead:deviation@0.15")
    assert lead.form == "lead" and lead.method == "deviation" and lead.blend_config().recompute_ratio == 0.15
    assert parse_config("reuse+alone").form == "alone" and parse_config("reuse+alone").reuse
    assert parse_config("blend@0.15").form is None  # the engine's form
    with pytest.raises(ValueError):
        parse_config("reuse+lead:x")


def test_the_engine_answers_as_the_suite_measures(runner, tmp_path):
    """The suite's numbers stand for the service: with the exact kernels, the engine (prefix block from
    its store, chunks from its store, its scheduler's decode) gives the suite evaluator's text in
    full, reuse and blend. A prefix computed in the chunk form broke exactly this. (No sequence tree: its exact
    head would serve reuse and blend exactly after full ran, which the suite's per-mode figures leave out.)"""
    from ragkv.bench.quality.evaluate import evaluate_prompt
    from workers.batching.scheduler import BatchConfig
    from workers.engine import Engine, EngineConfig
    from workers.requests import GenerateRequest

    engine = Engine(EngineConfig(store=f"disk:{tmp_path / 'blocks'}", codec="int8", prefill_kernel="fp32",
                                 batch=BatchConfig(decode_kernel="fp32"), sequence_cache=False), runner=runner)
    count = lambda text: len(runner.tokenize(text))  # noqa: E731
    rows = {"full": "full", "reuse": "reuse", "blend": f"blend:{BlendConfig().method}@0.15"}
    try:
        # one prompt with a system prompt: the prefix block, stored chunks and the question all take part
        for p in make_prompts("dev", count, ["system_prompt"], per_family=1, sizes=(500,)):
            suite = evaluate_prompt(runner, p, [parse_config(n) for n in rows.values()], codec="int8")
            for mode, name in rows.items():
                served = engine.generate(GenerateRequest(
                    question=p.question, chunks=p.chunks, system_prompt=p.system_prompt, mode=mode,
                    max_new_tokens=p.max_new_tokens, recompute_ratio=0.15 if mode == "blend" else None))
                assert served.text == suite[name].text, (p.family, mode)
    finally:
        engine.close()
