"""`dataset=function`: the rows a function of the user's returns, by import path (grpo_exp.data)."""

import sys
import textwrap

import pytest

from grpo_exp.data import check_data_files, load_splits
from grpo_exp.errors import UserError
from support.config import compose_config
from tests.helpers.modules import unseen_module_name

MODULE = """
from datasets import Dataset, DatasetDict


def rows(n=10, answer_format="plain"):
    answer = "Reasoning... #### {}" if answer_format == "gsm8k" else "{}"
    return [{"q": f"What is {i} + 1?", "a": answer.format(i + 1), "extra": i} for i in range(n)]


def table(n=10):
    return Dataset.from_list(rows(n))


def splits():
    return DatasetDict({"train": table(6), "test": table(3)})


def nothing():
    return []


def mixed():
    return [{"q": "x", "a": "1"}, ["not", "a", "dict"]]
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = unseen_module_name("user_data")  # a module of its own per test: no cached import across tests
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def data_cfg(module: str, function: str, *overrides: str):
    fields = ["dataset.question_field=q", "dataset.answer_field=a", "dataset.eval_size=3"]
    cfg = compose_config(["dataset=function", f"dataset.function={module}:{function}", *fields, *overrides])
    return cfg.dataset


def test_rows_are_carved_as_a_file_is(user_module):
    cfg = data_cfg(user_module, "rows", "+dataset.function_args.n=12")
    check_data_files(cfg)
    train, held_out = load_splits(cfg)
    assert (len(train), len(held_out)) == (9, 3)
    assert set(train["question"]).isdisjoint(held_out["question"])
    row = held_out[0]
    assert row["solution"] == str(int(row["question"].split()[2]) + 1)
    assert row["prompt"][-1]["content"].startswith(row["question"])  # the prompt template applied
    again, _ = load_splits(cfg)
    assert again["question"] == train["question"]  # dataset.seed: the same split every time


def test_a_dataset_and_gsm8k_answers(user_module):
    train, held_out = load_splits(data_cfg(user_module, "table"))
    assert (len(train), len(held_out)) == (7, 3)
    cfg = data_cfg(user_module, "rows", "dataset.answer_format=gsm8k", "+dataset.function_args.answer_format=gsm8k")
    _, held_out = load_splits(cfg)
    assert all(s.isdigit() for s in held_out["solution"])  # what follows '####'


def test_a_mapping_of_splits_is_taken_as_it_is(user_module):
    train, held_out = load_splits(data_cfg(user_module, "splits"))
    assert (len(train), len(held_out)) == (6, 3)


@pytest.mark.parametrize(
    "function,overrides,message",
    [
        ("nothing", [], "returned no rows"),
        ("mixed", [], "row 1 is a list, not a dict"),
        ("rows", ["dataset.eval_size=10"], "has 10 rows, not enough to hold out dataset.eval_size=10"),
        ("table", ["dataset.question_field=nope"], "dataset.question_field='nope': no such column"),
        ("splits", ["dataset.eval_split=validation"], "without ['validation']"),
    ],
)
def test_what_it_returns_is_checked_naming_the_key(user_module, function, overrides, message):
    with pytest.raises(UserError) as err:
        load_splits(data_cfg(user_module, function, *overrides))
    assert f"dataset.function={user_module}:{function}" in str(err.value) and message in str(err.value)


def test_a_dataset_function_without_dataset_function_is_refused():
    cfg = compose_config(["dataset.function=my_data:rows"])
    with pytest.raises(UserError, match=r"dataset.function is read only with dataset=function .* add dataset=function"):
        check_data_files(cfg.dataset)
