"""Built-in tasks, reward functions, reward combination and custom dataset loading."""

from __future__ import annotations

import asyncio
import csv
import json
import math
import re

import pytest
import torch

from workbench.engine import rewards
from workbench.engine.rewards import (
    REWARD_REGISTRY,
    RewardFunctionError,
    compute_rewards,
    exact_match,
    first_char,
    integer_format,
    load_reward_function,
    position_match,
)
from workbench.engine.tasks import TASKS, Task, arithmetic_rows, get_task, load_dataset_rows

torch.set_num_threads(1)


def _call(fn, completions, **columns):
    """Call a reward function the way the trainer does (prompts/ids are irrelevant here)."""
    n = len(completions)
    return fn(prompts=[""] * n, completions=completions, completion_ids=[[]] * n, **columns)


def _same(actual: torch.Tensor, expected: list[float]) -> bool:
    """Exact equality where NaN equals NaN."""
    return torch.equal(torch.nan_to_num(actual, nan=-999.0), torch.nan_to_num(torch.tensor(expected), nan=-999.0))


# ------------------------------------------------------------------------------ reward functions


def test_exact_match():
    completions = ["19", " 19\n", "19 ", "190", "", "-3", "19\n3+4=7", "x"]
    answers = ["19", "19", "19", "19", "19", "-3", "19", None]
    assert _call(exact_match, completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, None]
    assert _call(exact_match, ["7"], answer=[7]) == [1.0]  # CSV/JSON numbers compare as text


def test_integer_format():
    completions = ["19", "-3", " 7 ", "1a", "", "--1", "3-", "1 2", "0"]
    assert _call(integer_format, completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_position_match():
    completions = ["dcba", "dcbx", "dc", "dcbaaa", "abcd", "", " dcba\n", "x"]
    targets = ["dcba"] * 7 + [""]
    assert _call(position_match, completions, target=targets) == [1.0, 0.75, 0.5, 4 / 6, 0.0, 0.0, 1.0, None]


def test_first_char():
    completions = ["kxyz", "k", " k", "", "Kab", "a"]
    assert _call(first_char, completions, letter=["k", "k", "k", "k", "k", None]) == [1.0, 1.0, 0.0, 0.0, 0.0, None]


def test_missing_column_names_the_column():
    with pytest.raises(ValueError, match=r"'exact_match' needs a dataset column 'answer'.*\['target'\]"):
        _call(exact_match, ["1"], target=["1"])


def test_registry_names_are_reported():
    assert set(REWARD_REGISTRY) >= {"exact_match", "format", "position_match", "first_char"}
    assert rewards.reward_name(integer_format) == "format"
    assert rewards.reward_name(lambda **kw: []) == "<lambda>"


# ------------------------------------------------------------------------------ compute_rewards


def _a(prompts, completions, completion_ids, **kwargs):
    return [1.0, None, 0.5, None]


def _b(prompts, completions, completion_ids, **kwargs):
    return [0.0, 2.0, None, None]


def _batch(n=4):
    return dict(prompts=["p"] * n, completions=["c"] * n, completion_ids=[[1]] * n)


def test_compute_rewards_weights_and_none():
    total, per = compute_rewards([_a, _b], [1.0, 0.5], columns={}, **_batch())
    assert list(per) == ["_a", "_b"]
    assert _same(per["_a"], [1.0, math.nan, 0.5, math.nan])
    assert _same(per["_b"], [0.0, 2.0, math.nan, math.nan])
    # nansum of weight * reward; the last sample has no applicable reward -> 0 (as in TRL)
    assert torch.equal(total, torch.tensor([1.0, 1.0, 0.5, 0.0]))
    assert total.dtype == torch.float32 and total.shape == (4,)


def test_compute_rewards_default_weights_and_duplicate_names():
    total, per = compute_rewards([_a, _a], None, columns={}, **_batch())
    assert list(per) == ["_a", "_a_2"]
    assert torch.equal(total, torch.tensor([2.0, 0.0, 1.0, 0.0]))


def test_compute_rewards_with_task_rewards_and_columns():
    task = get_task("arithmetic")
    completions = ["12", "5", "x", "12 13"]
    total, per = compute_rewards(
        task.reward_functions(), task.reward_weights, ["7+5="] * 4, completions, [[1]] * 4,
        {"prompt": ["7+5="] * 4, "answer": ["12", "12", "12", "12"]},  # 'prompt' is not passed twice
    )
    assert list(per) == ["exact_match", "format"]
    assert torch.equal(per["exact_match"], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert torch.equal(per["format"], torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert torch.allclose(total, torch.tensor([1.2, 0.2, 0.0, 0.0]), atol=0, rtol=1e-6)


def test_compute_rewards_forwards_columns_and_trainer_state():
    seen = {}

    def spy(prompts, completions, completion_ids, **kwargs):
        seen.update(kwargs)
        return [0.0] * len(prompts)

    compute_rewards([spy], None, columns={"level": [1, 2], "completion": ["x", "y"]},
                    trainer_state={"step": 3}, **_batch(2))
    logging = {k: seen.pop(k) for k in ("log_extra", "log_metric")}  # TRL's callables, for a **kwargs function
    assert seen == {"level": [1, 2], "trainer_state": {"step": 3}} and all(map(callable, logging.values()))


def test_async_reward_functions_are_awaited():
    async def slow_double(prompts, completions, completion_ids, **kwargs):
        await asyncio.sleep(0.01)
        return [2.0 * len(c) for c in completions]

    args = dict(prompts=["p", "p"], completions=["ab", "abc"], completion_ids=[[1], [1]], columns={})
    total, per = compute_rewards([slow_double, _constant_one], [1.0, 1.0], **args)
    assert torch.equal(per["slow_double"], torch.tensor([4.0, 6.0]))
    assert torch.equal(total, torch.tensor([5.0, 7.0]))

    async def inside_a_running_loop():  # e.g. a notebook or an async server calling in
        return compute_rewards([slow_double], None, **args)

    total, _ = asyncio.run(inside_a_running_loop())
    assert torch.equal(total, torch.tensor([4.0, 6.0]))


def _constant_one(prompts, completions, completion_ids, **kwargs):
    return [1.0] * len(prompts)


def test_raising_function_is_named():
    def broken_reward(prompts, completions, completion_ids, **kwargs):
        return 1 / 0

    with pytest.raises(RewardFunctionError, match="'broken_reward' raised ZeroDivisionError") as info:
        compute_rewards([_constant_one, broken_reward], None, columns={}, **_batch())
    assert isinstance(info.value.__cause__, ZeroDivisionError)

    async def broken_async(prompts, completions, completion_ids, **kwargs):
        raise KeyError("answer")

    with pytest.raises(RewardFunctionError, match="'broken_async' raised KeyError") as info:
        compute_rewards([broken_async], None, columns={}, **_batch())
    assert isinstance(info.value.__cause__, KeyError)


def test_wrong_length_or_type_is_reported():
    def short(prompts, completions, completion_ids, **kwargs):
        return [1.0, 1.0]

    with pytest.raises(RewardFunctionError, match=r"'short' returned 2 rewards; expected 4"):
        compute_rewards([short], None, columns={}, **_batch())

    def text(prompts, completions, completion_ids, **kwargs):
        return ["good"] * len(prompts)

    with pytest.raises(RewardFunctionError, match=r"'text' returned 'good' at index 0"):
        compute_rewards([text], None, columns={}, **_batch())


def test_misaligned_inputs_are_rejected():
    with pytest.raises(ValueError, match=r"reward_weights has 2 values for 1 reward functions \(_a\)"):
        compute_rewards([_a], [1.0, 2.0], columns={}, **_batch())
    with pytest.raises(ValueError, match="column 'answer' has 3 values; expected 4"):
        compute_rewards([_a], None, columns={"answer": [1, 2, 3]}, **_batch())


# ------------------------------------------------------------------------------ load_reward_function


def test_load_reward_function_by_name_and_reference():
    assert load_reward_function("exact_match") is exact_match
    assert load_reward_function("format") is integer_format
    assert load_reward_function("workbench.engine.rewards:position_match") is position_match
    assert load_reward_function("tests.engine.test_tasks:_constant_one") is _constant_one


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("__import__('os').system('true')", "is not valid; expected a built-in reward name"),
        ("exact_match()", "is not valid"),
        ("workbench.engine.rewards", "is not valid; expected .*'package.module:function'"),
        ("", "is not valid"),
        ("no_such_module_xyz.sub:fn", "module 'no_such_module_xyz.sub' cannot be imported"),
        ("workbench.engine.rewards:nope", "has no attribute 'nope'"),
        ("workbench.engine.rewards:REWARD_REGISTRY", "not callable"),
    ],
)
def test_load_reward_function_errors(ref, message):
    with pytest.raises(ValueError, match=message) as info:
        load_reward_function(ref)
    assert repr(ref) in str(info.value)


# ------------------------------------------------------------------------------ tasks


def test_tasks_generate_deterministic_rows_whose_references_earn_full_reward():
    assert {"arithmetic", "reverse", "length_probe"} <= set(TASKS)
    for task in TASKS.values():
        assert task.__doc__ and task.make_dataset.__doc__ and task.description
        rows = task.make_dataset(40, 7)
        assert rows == task.make_dataset(40, 7) and rows != task.make_dataset(40, 8)
        assert all(isinstance(row["prompt"], str) and row["prompt"] for row in rows)
        columns = {key: [row[key] for row in rows] for key in rows[0]}
        prompts, references = columns["prompt"], columns["reference"]
        total, per = compute_rewards(task.reward_functions(), task.reward_weights, prompts, references,
                                     [[1]] * len(rows), columns)
        assert all(torch.equal(values, torch.ones(len(rows))) for values in per.values()), task.name
        assert torch.allclose(total, torch.full((len(rows),), float(sum(task.reward_weights))))


def test_arithmetic_rows_are_correct():
    for row in arithmetic_rows(200, 0):
        a, op, b = re.fullmatch(r"(\d+)([+-])(\d+)=", row["prompt"]).groups()
        assert 0 <= int(a) <= 10 and 0 <= int(b) <= 10
        assert int(row["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))


def test_length_probe_references_vary_in_length():
    lengths = {len(row["reference"]) for row in get_task("length_probe").make_dataset(300, 0)}
    assert lengths == set(range(1, 10))


def test_unknown_task_lists_registered_names():
    with pytest.raises(ValueError, match="unknown task 'nope'; registered tasks: arithmetic, arithmetic_drill, arithmetic_four, length_probe, reverse"):
        get_task("nope")


def test_task_weights_must_match_functions():
    with pytest.raises(ValueError, match=r"task 't': reward_weights has 1 values for 2 reward functions \(exact_match, format\)"):
        Task("t", "d", ("exact_match", "format"), (1.0,), arithmetic_rows)


# ------------------------------------------------------------------------------ custom datasets


def difficulty_bonus(prompts, completions, completion_ids, difficulty, **kwargs):
    """A custom reward function reading an extra dataset column."""
    return [float(d) / 10 for d in difficulty]


def _score_rows(rows):
    funcs = [load_reward_function(r) for r in ("exact_match", "tests.engine.test_tasks:difficulty_bonus")]
    columns = {key: [row[key] for row in rows] for key in rows[0]}
    prompts = columns["prompt"]
    return compute_rewards(funcs, [1.0, 1.0], prompts, ["4", "0"], [[1]] * len(rows), columns)


def test_jsonl_rows_reach_reward_functions(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(
        json.dumps({"prompt": "2+2=", "answer": "4", "difficulty": 3}) + "\n\n"
        + json.dumps({"prompt": "1-1=", "answer": 0, "difficulty": 5}) + "\n"
        + json.dumps({"prompt": "9+9=", "answer": "18", "difficulty": 9}) + "\n"
    )
    rows = load_dataset_rows(str(path), limit=2)
    assert rows == [{"prompt": "2+2=", "answer": "4", "difficulty": 3}, {"prompt": "1-1=", "answer": 0, "difficulty": 5}]
    total, per = _score_rows(rows)
    assert torch.equal(per["exact_match"], torch.tensor([1.0, 1.0]))
    assert torch.allclose(total, torch.tensor([1.3, 1.5]), atol=0, rtol=1e-6)


def test_csv_rows_reach_reward_functions(tmp_path):
    path = tmp_path / "data.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerows([["prompt", "answer", "difficulty"], ["2+2=", "4", "3"], ["1-1=", "1", "5"]])
    rows = load_dataset_rows(str(path))
    assert rows == [{"prompt": "2+2=", "answer": "4", "difficulty": "3"}, {"prompt": "1-1=", "answer": "1", "difficulty": "5"}]
    total, per = _score_rows(rows)
    assert torch.equal(per["exact_match"], torch.tensor([1.0, 0.0]))
    assert torch.allclose(total, torch.tensor([1.3, 0.5]), atol=0, rtol=1e-6)


def test_missing_prompt_column(tmp_path):
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"question": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl.*row 1 has no 'prompt' column \(it has 1 other columns\)"):
        load_dataset_rows(str(jsonl))
    table = tmp_path / "bad.csv"
    table.write_text("question,answer\n1+1=,2\n")
    with pytest.raises(ValueError, match=r"bad.csv.*row 0 has no 'prompt' column"):
        load_dataset_rows(str(table))


def test_dataset_source_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_dataset_rows(str(tmp_path / "missing.jsonl"))
    (tmp_path / "data.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match=r"unsupported file type '.parquet'; use one of .csv, .json, .jsonl"):
        load_dataset_rows(str(tmp_path / "data.parquet"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="has no rows"):
        load_dataset_rows(str(tmp_path / "empty.jsonl"))
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        load_dataset_rows(str(tmp_path / "broken.jsonl"))


def test_saved_datasets_directory(tmp_path):
    import datasets  # a runtime dependency (requirements.txt): custom data may be a saved dataset

    data = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "1+1=", "answer": "2"}])})
    data.save_to_disk(str(tmp_path / "ds"))
    assert load_dataset_rows(str(tmp_path / "ds")) == [{"prompt": "1+1=", "answer": "2"}]
    with pytest.raises(ValueError, match="no split 'test'"):
        load_dataset_rows(str(tmp_path / "ds"), split="test")


def test_arithmetic_drill_repeats_one_fixed_set_of_problems():
    from workbench.engine.tasks import ARITHMETIC_DRILL_SIZE, arithmetic_drill_rows, arithmetic_rows

    rows = arithmetic_drill_rows(100, seed=3)
    assert len(rows) == 100
    assert rows[:ARITHMETIC_DRILL_SIZE] == arithmetic_rows(ARITHMETIC_DRILL_SIZE, 3)
    assert rows[ARITHMETIC_DRILL_SIZE:2 * ARITHMETIC_DRILL_SIZE] == rows[:ARITHMETIC_DRILL_SIZE]
    assert get_task("arithmetic_drill").reward_funcs == get_task("arithmetic").reward_funcs


def test_quickstart_is_grpo_rloo_ppo_on_arithmetic_four_with_one_seed():
    from workbench.runs import quickstart_recipes

    recipes = quickstart_recipes()
    assert [r.name for r in recipes] == ["grpo", "rloo", "ppo"]
    assert {(r.task, r.model, r.train.seed, r.sampling.prompts_per_step) for r in recipes} == {("arithmetic_four", "tiny", 0, 4)}
    assert [r.algorithm.advantage for r in recipes] == ["grpo", "rloo", "gae"]


def test_reasoning_rewards_resolve_by_name():
    from workbench.engine.reasoning import REASONING_REWARDS

    for name, fn in REASONING_REWARDS.items():
        assert load_reward_function(name) is fn and rewards.reward_name(fn) == name


def test_one_resolver_for_built_in_and_reasoning_gym_tasks():
    from workbench.engine.tasks import resolve_task

    assert resolve_task("arithmetic") is TASKS["arithmetic"] and TASKS["arithmetic"].correct_reward == "exact_match"
    rg = resolve_task("reasoning_gym/basic_arithmetic", {"min_terms": 2, "max_terms": 2}, system_prompt="Be brief.")
    assert rg.correct_reward == "reasoning_gym" and rg.reward_funcs == ("reasoning_gym", "answer_format")
    train, held_out = rg.splits(5, 3, seed=0)
    assert [len(train), len(held_out)] == [5, 3] and train[0]["prompt"][0] == {"role": "system", "content": "Be brief."}
    with pytest.raises(ValueError, match="or reasoning_gym/<dataset>"):
        resolve_task("no_such_task")


def test_built_in_held_out_prompts_are_distinct_and_never_trained_on():
    train, held_out = TASKS["arithmetic"].splits(2048, 32, seed=3)
    prompts = [row["prompt"] for row in held_out]
    assert len(set(prompts)) == 32 and not set(prompts) & {row["prompt"] for row in train}
    assert TASKS["arithmetic"].splits(2048, 32, seed=3) == (train, held_out)  # deterministic
    assert TASKS["arithmetic"].splits(2048, 0, seed=3)[0] == arithmetic_rows(2048, 3)  # eval off: the pool as before
    with pytest.raises(ValueError, match="eval.num_prompts=300: task 'arithmetic' yields only 242 distinct prompts"):
        TASKS["arithmetic"].splits(2048, 300, seed=0)
