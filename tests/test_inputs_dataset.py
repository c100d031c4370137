"""A custom dataset and the reward functions are checked before the run directory exists: each
bad dataset of the class below, given to the real ``train`` command, is one line naming the field
(dataset=... / eval.dataset=...), exit 2, and no run directory. They used to end as exit 1 with a
failed run left behind (and a 50 MB prompt line took ~20 GB before step 0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli import assert_one_line_error, cli, leftovers
from workbench.engine.tasks import MAX_PROMPT_CHARS

GOOD_ROW = json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n"

# (file name, bytes, what the line must say after "dataset=")
BAD_DATASETS = [
    ("empty.jsonl", b"", "has no rows"),
    ("blank.csv", b"", "has no rows"),
    ("columns.jsonl", b'{"question": "1+1=", "answer": "2"}\n', "row 0 has no 'prompt' column (it has 2 other columns)"),
    ("columns.csv", b"question,answer\n1+1=,2\n", "row 0 has no 'prompt' column (it has 2 other columns)"),
    ("latin1.jsonl", GOOD_ROW.encode() + '{"prompt": "caf\xe9"}\n'.encode("latin-1"), "line 2 is not UTF-8"),
    ("latin1.csv", "prompt,answer\ncaf\xe9,2\n".encode("latin-1"), "line 2 is not UTF-8"),
    ("empty_prompt.jsonl", GOOD_ROW.encode() + b'{"prompt": "", "answer": "2"}\n', "row 1: prompt is empty"),
    ("blank_prompt.csv", b"prompt,answer\n  ,2\n", "row 0: prompt is empty"),
    ("number_prompt.jsonl", b'{"prompt": 12, "answer": "2"}\n', "row 0: prompt is a int, neither text"),
    ("long_prompt.jsonl", json.dumps({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}).encode() + b"\n",
     f"row 0: prompt has {MAX_PROMPT_CHARS + 1} characters: at most {MAX_PROMPT_CHARS}"),
    ("huge_field.csv", b'prompt,answer\n"' + b"x" * 200_000 + b'",2\n', "field larger than field limit"),
    ("broken.jsonl", b'{"prompt": "a"}\n{oops\n', "line 2 is not valid JSON"),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    ("extra_field.csv", b"prompt,answer\n1+1=,2\n2+2=,4,oops\n", "line 3 has more fields than the header's 2 columns"),
    ("huge_int.jsonl", GOOD_ROW.encode() + b'{"prompt": "a", "answer": ' + b"7" * 5000 + b"}\n",
     "line 2: an integer of more than"),
    ("huge_int.json", b'[{"prompt": "a", "answer": ' + b"7" * 5000 + b"}]", "an integer of more than"),
]

#: secrets a dataset error must never quote (the class: a row's header and values are the file's contents)
SECRETS = ("question", "1+1=", "oops", "7777")


@pytest.mark.parametrize("name, content, expected", BAD_DATASETS, ids=[c[0] for c in BAD_DATASETS])
def test_a_bad_dataset_is_one_line_before_the_run_exists(fresh_home, tmp_path, name, content, expected):
    path = fresh_home / name
    path.write_bytes(content)
    run_dir = tmp_path / "run"
    res = cli(fresh_home, "train", "grpo", "--set", f"dataset={path}", "--set", "train.steps=1", "--run-dir", str(run_dir))
    line = assert_one_line_error(res, f"dataset='{path}'", expected)
    assert len(line) < 600
    assert not any(secret in line.replace(str(path), "") for secret in SECRETS)
    assert not run_dir.exists() and leftovers(fresh_home) == []


def test_a_bad_eval_dataset_is_named_as_eval_dataset(fresh_home, tmp_path):
    good, bad = fresh_home / "good.jsonl", fresh_home / "bad.jsonl"
    good.write_text(GOOD_ROW)
    bad.write_text('{"prompt": ""}\n')
    res = cli(fresh_home, "train", "grpo", "--set", f"dataset={good}", "--set", f"eval.dataset={bad}",
              "--set", "eval.every=1", "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(res, f"eval.dataset='{bad}'", "prompt is empty")
    assert not (tmp_path / "run").exists()


def test_a_dataset_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """The size is read from the file system: a file over the limit is never loaded."""
    from workbench.engine import tasks

    path = tmp_path / "big.jsonl"
    path.write_text(GOOD_ROW * 100)
    monkeypatch.setattr(tasks, "MAX_DATASET_BYTES", 1000)
    with pytest.raises(tasks.DatasetError, match=r"dataset='.*big.jsonl': \d+ bytes: at most 1000"):
        tasks.load_dataset_rows(str(path))


@pytest.mark.parametrize("ref, expected", [
    ("no_such_module_xyz:reward", "module 'no_such_module_xyz' cannot be imported"),
    ("json:no_such_function", "has no attribute"),
    ("not a reference", "is not valid"),
])
def test_a_bad_reward_reference_is_one_line_before_the_run_exists(fresh_home, tmp_path, ref, expected):
    res = cli(fresh_home, "train", "grpo", "--set", f"reward_funcs=[{ref!r}]", "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(res, "reward_funcs", expected)
    assert not (tmp_path / "run").exists() and leftovers(fresh_home) == []


def test_reward_weights_are_counted_before_the_run_exists(fresh_home, tmp_path):
    res = cli(fresh_home, "train", "grpo", "--set", "reward_funcs=[exact_match]", "--set", "reward_weights=[1, 2]",
              "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(res, "reward_weights has 2 values for 1 reward functions")
    assert not (tmp_path / "run").exists()


def test_a_good_dataset_passes_the_check(fresh_home):
    from workbench.engine.precheck import check_run_inputs
    from workbench.recipe import load_recipe

    path = fresh_home / "good.csv"
    path.write_text("prompt,answer\n1+1=,2\ncafé,3\n")
    check_run_inputs(load_recipe("grpo", [f"dataset={path}"]))


@pytest.mark.parametrize("name, content", [
    ("excel.csv", "\ufeffprompt,answer\n1+1=,2\n".encode()),
    ("bom.jsonl", "\ufeff".encode() + GOOD_ROW.encode()),
    ("bom.json", "\ufeff".encode() + b"[" + GOOD_ROW.strip().encode() + b"]"),
])
def test_a_utf8_file_with_a_byte_order_mark_reads_as_without(tmp_path, name, content):
    """Excel's "CSV UTF-8" starts with a BOM: the first column was '\\ufeffprompt', so no 'prompt'."""
    from workbench.engine.tasks import load_dataset_rows

    path = tmp_path / name
    path.write_bytes(content)
    assert load_dataset_rows(str(path)) == [{"prompt": "1+1=", "answer": "2"}]
