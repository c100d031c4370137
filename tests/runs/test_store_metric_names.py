"""RunStore.metric_names on a real SQLite file: the numeric metric names the chosen runs logged."""

from workbench.runs import RunStore


def _run(store, run_id, *metric_lines):
    store.create_run(run_id=run_id, name=run_id, algorithm="grpo", recipe_yaml="name: grpo\n", total_steps=10,
                     target="local", launcher="local", host="localhost", created_by="ann", run_dir="/tmp/x")
    store.ingest(run_id, [{"kind": "metrics", "step": step, "time": 100.0 + step, "metrics": metrics}
                          for step, metrics in enumerate(metric_lines)])


def test_names_of_every_step_of_the_chosen_runs_sorted_numeric_only(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    # a log_metric name and eval/* appear at later steps only; text and null values are not chartable
    _run(store, "a", {"reward": 0.5, "kl": 0.0, "step": 0},
         {"reward": 0.6, "kl": 0.1, "judge/score": 3, "eval/pass@1": 0.25, "note": "text", "gone": None, "step": 1})
    _run(store, "b", {"reward": 1.0, "rewards/acc/mean": 1.0, "rewards/acc/std": 0.0})
    _run(store, "c", {"other": 1.0})
    assert store.metric_names(["a", "b"]) == ["eval/pass@1", "judge/score", "kl", "reward", "rewards/acc/mean",
                                              "rewards/acc/std", "step"]
    assert store.metric_names(["c"]) == ["other"]
    assert store.metric_names([]) == [] and store.metric_names(["nobody"]) == []
