"""reasoning_gym/<name> tasks: disjoint train/eval splits, the datasets' verifiers, format reward."""

import json
import subprocess
import sys

import pytest

from tests.helpers import missing_component

for _module in ("reasoning_gym", "math_verify"):
    try:
        __import__(_module)
    except ImportError:
        missing_component(f"{_module} is not installed (pip install reasoning-gym math-verify)")

from workbench.engine.reasoning import (  # noqa: E402
    EVAL_SEED_OFFSET,
    answer_format_reward,
    create_procedural_dataset,
    final_number,
    final_number_reward,
    math_verify_reward,
    reasoning_gym_reward,
    reasoning_gym_task,
)


def columns(rows):
    """Rows -> the keyword columns a reward function receives (as the trainer passes them)."""
    return {k: [row[k] for row in rows] for k in rows[0] if k != "prompt"}


def test_nearby_seeds_share_rows_which_is_why_eval_uses_a_far_offset():
    a = create_procedural_dataset("basic_arithmetic", {}, size=3, seed=1)
    b = create_procedural_dataset("basic_arithmetic", {}, size=3, seed=2)
    assert a[1]["question"] == b[0]["question"]  # row i is seeded with Random(seed + i)


def test_train_and_eval_splits_hold_no_common_question():
    task = reasoning_gym_task("reasoning_gym/basic_arithmetic")
    train, held_out = task.splits(200, 100, seed=7)
    assert len(train) == 200 and len(held_out) == 100
    assert not {r["question"] for r in train} & {r["question"] for r in held_out}
    direct = create_procedural_dataset("basic_arithmetic", {}, size=100, seed=7 + EVAL_SEED_OFFSET)
    assert [r["question"] for r in held_out] == [direct[i]["question"] for i in range(100)]
    assert task.splits(200, 100, seed=7) == (train, held_out)  # deterministic in the seed


def test_a_small_question_space_still_gives_a_disjoint_eval_split():
    """Single-digit sums have ~150 distinct questions: 40 + 40 random draws collide unless the
    train split skips the eval split's questions."""
    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ("+",),
              "allow_parentheses": False, "allow_negation": False}
    task = reasoning_gym_task("reasoning_gym/basic_arithmetic", config)
    naive_train = create_procedural_dataset("basic_arithmetic", config, size=40, seed=0)
    naive_eval = create_procedural_dataset("basic_arithmetic", config, size=40, seed=EVAL_SEED_OFFSET)
    assert {naive_train[i]["question"] for i in range(40)} & {naive_eval[i]["question"] for i in range(40)}
    train, held_out = task.splits(40, 40, seed=0)
    assert len(train) == 40 and not {r["question"] for r in train} & {r["question"] for r in held_out}


def test_rows_are_conversational_and_ask_for_an_answer_block():
    row = reasoning_gym_task("reasoning_gym/basic_arithmetic").make_dataset(1, seed=0)[0]
    system, user = row["prompt"]
    assert system["role"] == "system" and "<answer>answer here</answer>" in system["content"]
    assert user == {"role": "user", "content": row["question"]}
    assert row["reference"] == f"<answer>{row['answer']}</answer>"


def test_the_verifier_scores_the_extracted_answer():
    rows = reasoning_gym_task("reasoning_gym/basic_arithmetic").make_dataset(2, seed=3)
    gold = rows[0]["answer"]
    wrong = str(int(gold) + 1)
    both = rows[:1] * 4
    completions = [f"Let me add.\n<answer>{gold}</answer>", f"<answer>{wrong}</answer>", gold,
                   [{"role": "assistant", "content": f"<answer> {gold} </answer>"}]]
    assert reasoning_gym_reward(completions, **columns(both)) == [1.0, 0.0, 0.0, 1.0]


def test_the_verifier_accepts_any_correct_countdown_expression():
    """Not string equality: countdown's verifier evaluates the expression and checks the numbers."""
    row = reasoning_gym_task("reasoning_gym/countdown").make_dataset(1, seed=3)[0]
    gold, first = row["answer"], row["metadata"]["numbers"][0]
    completions = [f"<answer>{gold}</answer>", f"<answer>({gold})</answer>", f"<answer>{gold} + 0 * {first}</answer>"]
    # the third reuses a number: reasoning-gym's partial credit for a well-formed wrong answer
    assert reasoning_gym_reward(completions, **columns([row] * 3)) == [1.0, 1.0, 0.05]


def test_the_format_reward_values():
    completions = [
        "<answer>12</answer>",
        "7 + 5 is 12.\n<answer>12</answer>\n",
        "<answer>12</answer> and more",
        "<answer>  </answer>",
        "12",
        "<answer>1</answer><answer>2</answer>",
        "</answer>12<answer>",
        [{"role": "assistant", "content": "<answer>x</answer>"}],
    ]
    assert answer_format_reward(completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_math_verify_accepts_equivalent_forms():
    completions = ["<answer>0.5</answer>", "<answer>\\frac{1}{2}</answer>", "<answer>1/3</answer>", "1/2",
                   "<answer>12</answer>"]
    answers = ["1/2", "1/2", "1/2", "1/2", "no maths here"]
    assert math_verify_reward(completions, answer=answers) == [1.0, 1.0, 0.0, 0.0, None]


@pytest.mark.parametrize("text, number", [
    ("7 + 7 = 14.", 14.0),  # a full stop ends the sentence, not the number
    ("5-7=-2", -2.0),  # a minus sign right before digits is the number's
    ("7 - 3 = 4", 4.0),  # a spaced minus is the operator
    ("It is 1,234 apples", 1234.0),  # thousands commas
    ("1,2 and 3.50", 3.5),  # a comma before fewer than 3 digits separates numbers
    ("+3", 3.0),
    ("9007199254740993", 9007199254740993),  # 2^53 + 1: exact (as a float it would equal 2^53)
    ("no digits", None),
    ("", None),
])
def test_final_number_reads_the_last_number_as_written(text, number):
    assert final_number(text) == number


def test_final_number_reward_compares_the_replys_last_number_with_the_answer():
    completions = ["7 + 7 = 14.", "The answer is 14, not 12", "14 or 12", "no number", "-4", "4",
                   [{"role": "assistant", "content": "So 10.0"}], "anything", "2"]
    answers = ["14", "14", "14", "14", "-4", "-4", "10", "ten", "1/2"]
    # the LAST number counts ("14, not 12" scores 0); gold not a number ("ten") -> None: skipped, as
    # math_verify does with gold it cannot parse; "1/2" is no single number, so "2" does not match it
    assert final_number_reward(completions, answer=answers) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, None, None]
    # numbers past float precision compare exactly: 2^53 is not 2^53 + 1
    assert final_number_reward(["9007199254740992", "9007199254740993"], answer=["9007199254740993"] * 2) == [0.0, 1.0]


def test_final_number_is_a_built_in_reward_of_recipes():
    from workbench.engine.rewards import load_reward_function

    assert load_reward_function("final_number") is final_number_reward


def test_rewards_run_through_the_trainers_batch_scorer():
    from workbench.engine.rewards import compute_rewards

    task = reasoning_gym_task("reasoning_gym/basic_arithmetic")
    rows = task.make_dataset(2, seed=0)
    completions = [rows[0]["reference"], "no idea"]
    total, per_fn = compute_rewards(task.reward_functions(), task.reward_weights, [str(r["prompt"]) for r in rows],
                                    completions, [[1], [1]], columns(rows))
    assert list(per_fn) == ["reasoning_gym", "answer_format"] and task.reward_weights == (1.0, 0.2)
    assert total.tolist() == pytest.approx([1.2, 0.0])
    assert reasoning_gym_task("reasoning_gym/basic_arithmetic", format_weight=0).reward_funcs == ("reasoning_gym",)


@pytest.mark.parametrize(
    ("task", "config", "message"),
    [
        ("reasoning_gym/basic_arithmatic", {}, r"task='reasoning_gym/basic_arithmatic': .* no dataset .*basic_arithmetic"),
        ("reasoning_gym/basic_arithmetic", {"bogus": 1}, r"task_config=\{'bogus': 1\} is not valid .*allowed keys: min_terms"),
        ("reasoning_gym/basic_arithmetic", {"min_terms": 5, "max_terms": 2}, r"task_config=.* is not valid .*max_terms must be"),
        ("reasoning_gym/basic_arithmetic", {"seed": 3}, r"task_config sets seed .* the workbench sets those"),
    ],
)
def test_bad_tasks_and_configs_fail_with_one_line(task, config, message):
    with pytest.raises(ValueError, match=message) as info:
        reasoning_gym_task(task, config)
    assert "\n" not in str(info.value)


def test_validating_a_task_does_not_import_torch():
    script = (
        "import json, sys\n"
        "from workbench.engine.reasoning import reasoning_gym_task\n"
        "task = reasoning_gym_task('reasoning_gym/countdown', {'min_numbers': 3, 'max_numbers': 3})\n"
        "print(json.dumps([task.name, task.config, 'torch' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["reasoning_gym/countdown", {"min_numbers": 3, "max_numbers": 3}, False]
