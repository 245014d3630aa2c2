"""Datasets: chat prompts plus a reference answer, with a disjoint held-out split and a seed."""

import json

import pytest

from grpo_exp.data import check_data_files, gsm8k_final_answer, load_splits
from grpo_exp.errors import UserError
from support.config import compose_config


def splits(*overrides: str):
    return load_splits(compose_config(list(overrides)).dataset)


def test_reasoning_gym_split_is_disjoint_sized_and_seeded():
    train, held_out = splits("dataset.train_size=200", "dataset.eval_size=16")
    assert len(held_out) == 16 and 0 < len(train) <= 200
    assert not set(train["question"]) & set(held_out["question"])
    prompt = train[0]["prompt"]
    assert prompt[-1]["role"] == "user" and "\\boxed{}" in prompt[-1]["content"]
    again, _ = splits("dataset.train_size=200", "dataset.eval_size=16")
    assert again["question"] == train["question"]
    other, _ = splits("dataset.train_size=200", "dataset.eval_size=16", "dataset.seed=1")
    assert other["question"] != train["question"]


def test_system_prompt_is_prepended():
    train, _ = splits("dataset.train_size=4", "dataset.eval_size=2", "dataset.prompt.system=Be brief.")
    assert train[0]["prompt"][0] == {"role": "system", "content": "Be brief."}


def test_unknown_task_and_bad_task_config_name_the_key():
    with pytest.raises(UserError, match="dataset.task='basic_arithmetc'.*basic_arithmetic"):
        splits("dataset.task=basic_arithmetc")
    with pytest.raises(UserError, match="dataset.task_config.*min_terms"):
        splits("+dataset.task_config.colour=1")


def test_gsm8k_format_files_carve_a_held_out_split(tmp_path):
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"q{i}?", "answer": f"work\n#### {i},000"} for i in range(10)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    train, held_out = splits("dataset=gsm8k", f"dataset.path={path}", "dataset.eval_size=3")
    assert len(train) == 7 and len(held_out) == 3
    assert set(train["question"]) | set(held_out["question"]) == {r["question"] for r in rows}
    assert all(s.endswith("000") and "," not in s for s in train["solution"])


def test_files_with_named_columns_and_separate_eval_file(tmp_path):
    train_file, eval_file = tmp_path / "t.jsonl", tmp_path / "e.jsonl"
    train_file.write_text("\n".join(json.dumps({"problem": f"p{i}", "sol": str(i)}) for i in range(5)))
    eval_file.write_text(json.dumps({"problem": "e", "sol": "9"}))
    overrides = ["dataset=files", f"dataset.path={train_file}", f"dataset.eval_path={eval_file}"]
    train, held_out = splits(*overrides, "dataset.question_field=problem", "dataset.answer_field=sol")
    assert train["solution"] == ["0", "1", "2", "3", "4"] and held_out["question"] == ["e"]
    with pytest.raises(UserError, match="dataset.question_field='question' is not a column"):
        splits(*overrides)


def test_missing_file_fails_before_loading():
    cfg = compose_config(["dataset=files", "dataset.path=/nope/train.jsonl"])
    with pytest.raises(UserError, match="dataset.path='/nope/train.jsonl' does not exist"):
        check_data_files(cfg.dataset)


def test_unreachable_hub_dataset_gives_a_clear_error():
    with pytest.raises(UserError, match="dataset.path='openai/gsm8k'.*local"):
        splits("dataset=gsm8k")


def test_an_unreachable_hub_dataset_fails_in_the_checks_before_any_model_loads():
    with pytest.raises(UserError, match="dataset.path='openai/gsm8k' could not be loaded from the Hugging Face Hub"):
        check_data_files(compose_config(["dataset=gsm8k"]).dataset)


def test_gsm8k_final_answer():
    assert gsm8k_final_answer("a #### b\n#### 1,234") == "1234"
