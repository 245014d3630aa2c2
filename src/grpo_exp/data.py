"""Config -> (train, held-out) datasets of chat prompts with a reference answer.

Every source yields rows {"prompt": [chat messages], "solution": reference answer, "question": text};
TRL passes `solution` on to the reward functions. Sources: reasoning-gym tasks, Hugging Face Hub datasets, local
files, and the rows a function of the user's returns (dataset=function dataset.function=module:name).
"""

import difflib
import inspect
import json
import logging
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import reasoning_gym
from datasets import Dataset, load_dataset, load_dataset_builder
from datasets.exceptions import DatasetGenerationError
from omegaconf import DictConfig, OmegaConf
from reasoning_gym.composite import DatasetSpec
from reasoning_gym.factory import DATASETS

from grpo_exp.config_rules import OnlyWith
from grpo_exp.errors import UserError
from grpo_exp.plugins import call_user, check_takes, import_callable
from grpo_exp.schema import AnswerFormat, DataSource
from grpo_exp.task_levels import level_entries, level_ranges

log = logging.getLogger(__name__)

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


# The column a row names its environment in (rollout.environment={name: module:Class}), carried when a source has it.
ENVIRONMENT_COLUMN = "environment"


def gsm8k_final_answer(solution: str) -> str:
    """GSM8K's reference answer: what follows the last '####', without thousands separators."""
    return solution.split("####")[-1].strip().replace(",", "")


def chat_prompt(question: str, prompt_cfg: DictConfig) -> list[dict[str, str]]:
    # str.replace, not str.format: templates hold literal braces such as \boxed{}.
    messages = [{"role": "user", "content": prompt_cfg.template.replace("{question}", question)}]
    if prompt_cfg.system:
        messages.insert(0, {"role": "system", "content": prompt_cfg.system})
    return messages


def _rows(questions: list[str], answers: list[str], data_cfg: DictConfig) -> list[dict]:
    if data_cfg.answer_format is AnswerFormat.gsm8k:
        answers = [gsm8k_final_answer(a) for a in answers]
    return [
        {"prompt": chat_prompt(q, data_cfg.prompt), "solution": str(a), "question": q}
        for q, a in zip(questions, answers, strict=True)
    ]


def _task_rows(entries: list[dict], data_cfg: DictConfig) -> list[dict]:
    """reasoning-gym rows: each keeps its task's name and its whole entry (JSON: what the task's own score_answer
    reads, grpo_exp.verification.task_score)."""
    rows = _rows([e["question"] for e in entries], [str(e["answer"]) for e in entries], data_cfg)
    for row, entry in zip(rows, entries, strict=True):
        row["task_name"] = entry["metadata"].get("source_dataset", data_cfg.task)
        row["task_entry"] = json.dumps(entry, default=str)
    return rows


def _level_rows(entries: list[tuple[dict, int]], data_cfg: DictConfig) -> list[dict]:
    rows = _task_rows([entry for entry, _ in entries], data_cfg)
    for row, (_, level) in zip(rows, entries, strict=True):
        row["task_level"] = level
    return rows


def _check_task_name(task: str | None, key: str = "dataset.task") -> None:
    if task is None:
        raise UserError(
            f"{key} is required: name a reasoning-gym task, e.g. {key}=spell_backward ({len(DATASETS)} tasks: "
            "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'), or a mix in dataset.tasks"
        )
    if task not in DATASETS or task == "composite":
        close = difflib.get_close_matches(str(task), DATASETS, n=5)
        raise UserError(
            f"{key}='{task}' is not a reasoning-gym task"
            + (f"; did you mean one of {close}?" if close else "")
            + f" ({len(DATASETS)} tasks: python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))')"
        )


def _reasoning_gym_task(data_cfg: DictConfig, size: int | None = None, seed: int | None = None):
    size = size or (data_cfg.train_size or 1000) + data_cfg.eval_size
    seed = data_cfg.seed if seed is None else seed
    if data_cfg.tasks:
        return _reasoning_gym_mix(data_cfg, size, seed)
    task = data_cfg.task
    _check_task_name(task)
    task_config = _with_local_files(OmegaConf.to_container(data_cfg.task_config))
    try:
        return reasoning_gym.create_dataset(task, size=size, seed=seed, **task_config)
    except (TypeError, AssertionError, ValueError) as err:
        allowed = [p for p in inspect.signature(DATASETS[task][1]).parameters if p not in ("seed", "size")]
        raise UserError(
            f"dataset.task_config for '{task}' {given_settings(data_cfg.task_config)} is invalid ({err}); "
            f"its settings are: {allowed}"
        ) from err


def given_settings(settings) -> str:
    """A task's settings as the user gave them, for a message: "(min_word_len=30, max_word_len=40)", or "(none
    given: the task's defaults)"."""
    settings = OmegaConf.to_container(settings) if isinstance(settings, DictConfig) else dict(settings or {})
    given = ", ".join(f"{name}={value!r}" for name, value in settings.items())
    return f"({given})" if given else "(none given: the task's defaults)"


def _with_local_files(task_config: dict) -> dict:
    """A task's settings with each file it names (a setting ending in _file or _path) that exists relative to the
    directory the command runs in made absolute: reasoning-gym reads a relative one from its own data folder."""
    found = {}
    for name, value in task_config.items():
        local = Path(value) if isinstance(value, str) and name.endswith(("_file", "_path")) else None
        found[name] = str(local.resolve()) if local and not local.is_absolute() and local.is_file() else value
    return found


@contextmanager
def reasoning_gym_raising(data_cfg: DictConfig):
    """Whatever reasoning-gym raises while it builds or generates the task's problems (a setting range with nothing
    in it, a file it cannot find...) becomes one message naming the key the user set, in the library's own words."""
    try:
        yield
    except UserError:
        raise
    except Exception as err:
        if data_cfg.tasks:
            key = "dataset.tasks " + "; ".join(
                f"{name}: {given_settings(spec.get('config') if isinstance(spec, dict) else None)}"
                for name, spec in OmegaConf.to_container(data_cfg.tasks).items()
            )
        else:
            key = f"dataset.task_config for '{data_cfg.task}' {given_settings(data_cfg.task_config)}"
        raise library_failure(key, err) from err


def library_failure(where: str, err: Exception) -> UserError:
    """What reasoning-gym raised making the problems of `where` (the settings the user gave), in its own words."""
    hint = ""
    if isinstance(err, FileNotFoundError):
        hint = (
            f"; a relative file is looked for in {Path.cwd()} (where the command runs), then in reasoning-gym's "
            "own data folder: give a path that exists"
        )
    return UserError(f"{where}: reasoning-gym could not make its problems ({type(err).__name__}: {err}){hint}")


def _reasoning_gym_mix(data_cfg: DictConfig, size: int, seed: int):
    """reasoning-gym's composite dataset of dataset.tasks, {name: {weight, config}}: each checked, one message each."""
    if data_cfg.task is not None:
        raise UserError(
            f"dataset.task={data_cfg.task} and dataset.tasks are two ways to choose the task: keep one "
            "(dataset.task=null for a mix)"
        )
    specs = []
    for name, spec in OmegaConf.to_container(data_cfg.tasks).items():
        _check_task_name(name, f"dataset.tasks.{name}")
        spec = spec or {}
        unknown = sorted(set(spec) - {"weight", "config"})
        weight = spec.get("weight", 1.0)
        if unknown or not isinstance(weight, int | float) or not weight > 0:
            raise UserError(
                f"dataset.tasks.{name}: {{weight: a number > 0, config: {{the task's settings}}}}, got {spec!r}"
            )
        config = _with_local_files(spec.get("config") or {})
        where = f"dataset.tasks.{name}.config {given_settings(spec.get('config'))}"
        try:
            next(iter(reasoning_gym.create_dataset(name, size=1, seed=seed, **config)))  # one problem generated
        except (TypeError, AssertionError, ValueError) as err:
            allowed = [p for p in inspect.signature(DATASETS[name][1]).parameters if p not in ("seed", "size")]
            raise UserError(f"{where} is invalid ({err}); its settings are: {allowed}") from err
        except Exception as err:  # what the task raises making a problem: an empty range, a file it cannot read
            raise library_failure(where, err) from err
        specs.append(DatasetSpec(name, float(weight), config))
    return reasoning_gym.create_dataset("composite", size=size, seed=seed, datasets=specs)


def _reasoning_gym_splits(data_cfg: DictConfig) -> tuple[list[dict], list[dict]]:
    """One seeded stream: the first eval_size distinct questions are held out, the rest (minus repeats) train.
    With dataset.levels, a stream per task and level (grpo_exp.task_levels), each row with its task_level."""
    if data_cfg.levels.enabled:
        return tuple(_level_rows(entries, data_cfg) for entries in level_entries(data_cfg))
    held_out: dict[str, dict] = {}
    train: list[dict] = []
    for item in _reasoning_gym_task(data_cfg):
        if len(held_out) < data_cfg.eval_size:
            held_out.setdefault(item["question"], item)
        elif item["question"] not in held_out:
            train.append(item)
    if data_cfg.train_size:
        train = train[: data_cfg.train_size]
    return _task_rows(train, data_cfg), _task_rows(list(held_out.values()), data_cfg)


def _load_file(path: str, key: str) -> Dataset:
    file = _local_file(path, key)
    return load_dataset(FILE_BUILDERS[file.suffix], data_files=str(file), split="train")


def _load_hub(data_cfg: DictConfig, split: str) -> Dataset:
    try:
        return load_dataset(data_cfg.path, data_cfg.hub_config, split=split)
    except Exception as err:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ValueError...)
        raise _unreachable_hub_dataset(data_cfg, f" (split '{split}')", err) from err


def _check_hub(data_cfg: DictConfig) -> None:
    """A hub dataset is found (its builder's metadata; no data is downloaded)."""
    try:
        load_dataset_builder(data_cfg.path, data_cfg.hub_config)
    except Exception as err:  # as _load_hub
        raise _unreachable_hub_dataset(data_cfg, "", err) from err


def _unreachable_hub_dataset(data_cfg: DictConfig, split: str, err: Exception) -> UserError:
    return UserError(
        f"dataset.path='{data_cfg.path}'{split} could not be loaded from the Hugging Face Hub: "
        f"{str(err).splitlines()[0]}. Without the hub, point dataset.path (and dataset.eval_path) at local "
        "jsonl/parquet files."
    )


def _table_rows(table: Dataset, data_cfg: DictConfig, limit: int | None) -> list[dict]:
    for key in ("question_field", "answer_field"):
        if data_cfg[key] not in table.column_names:
            raise UserError(f"dataset.{key}='{data_cfg[key]}' is not a column; columns: {table.column_names}")
    if limit is not None:
        table = table.select(range(min(limit, len(table))))
    rows = _rows(
        [str(q) for q in table[data_cfg.question_field]],
        ["" if a is None else str(a) for a in table[data_cfg.answer_field]],  # null: no answer (refused if all are)
        data_cfg,
    )
    if ENVIRONMENT_COLUMN in table.column_names:  # which environment each row plays (rollout.environment={...})
        for row, name in zip(rows, table[ENVIRONMENT_COLUMN], strict=True):
            row[ENVIRONMENT_COLUMN] = None if name is None else str(name)
    return rows


def _table_splits(data_cfg: DictConfig) -> tuple[list[dict], list[dict]]:
    local = data_cfg.path and Path(data_cfg.path).expanduser().suffix in FILE_BUILDERS
    if data_cfg.source is DataSource.function:
        train, held_out = _function_splits(data_cfg)
    elif data_cfg.source is DataSource.hub and not local:
        train, held_out = _load_hub(data_cfg, data_cfg.train_split), _load_hub(data_cfg, data_cfg.eval_split)
    elif data_cfg.eval_path:
        train = _load_file(data_cfg.path, "dataset.path")
        held_out = _load_file(data_cfg.eval_path, "dataset.eval_path")
    else:
        train, held_out = _carve(
            _load_file(data_cfg.path, "dataset.path"),
            data_cfg,
            f"dataset.path='{data_cfg.path}'",
            "set dataset.eval_path",
        )
    return _table_rows(train, data_cfg, data_cfg.train_size), _table_rows(held_out, data_cfg, data_cfg.eval_size)


def _carve(table: Dataset, data_cfg: DictConfig, what: str, instead: str) -> tuple[Dataset, Dataset]:
    """(train, held-out): the first eval_size rows of a seeded shuffle are held out."""
    table = table.shuffle(seed=data_cfg.seed)
    if len(table) <= data_cfg.eval_size:
        raise UserError(
            f"{what} has {len(table)} rows, not enough to hold out dataset.eval_size={data_cfg.eval_size} and still "
            f"train; lower dataset.eval_size or {instead}"
        )
    return table.select(range(data_cfg.eval_size, len(table))), table.select(range(data_cfg.eval_size))


# ---- dataset=function: the user's function by import path ----------------------------------------------------

FUNCTION_KEY = "dataset.function"
FUNCTION_CONVENTION = (
    "a dataset function returns rows, a list of dicts or a datasets.Dataset, each with the question and the answer "
    "(dataset.question_field, dataset.answer_field), or a mapping of splits {dataset.train_split: rows, "
    "dataset.eval_split: rows}"
)


def _data_function(data_cfg: DictConfig):
    if not data_cfg.function:
        raise UserError(
            f"{FUNCTION_KEY} is required with dataset={data_cfg.name} ({FUNCTION_KEY}=module:name, e.g. "
            f"{FUNCTION_KEY}=my_data:rows: {FUNCTION_CONVENTION})"
        )
    return import_callable(data_cfg.function, FUNCTION_KEY, "a function returning the dataset's rows")


def check_data_function(data_cfg: DictConfig) -> None:
    """The resolve phase: the import path, and the signature against dataset.function_args (not called yet)."""
    kwargs = OmegaConf.to_container(data_cfg.function_args, resolve=True)
    check_takes(_data_function(data_cfg), kwargs, f"{FUNCTION_KEY}={data_cfg.function}", "dataset.function_args")


def _function_splits(data_cfg: DictConfig) -> tuple[Dataset, Dataset]:
    """The user's rows, called once with dataset.function_args: a mapping of splits taken as it is, else carved."""
    where = f"{FUNCTION_KEY}={data_cfg.function}"
    kwargs = OmegaConf.to_container(data_cfg.function_args, resolve=True)
    given = f"the keys of dataset.function_args {sorted(kwargs)}" if kwargs else "no dataset.function_args"
    returned = call_user(_data_function(data_cfg), where, given=given, **kwargs)
    if isinstance(returned, Mapping):  # a dict of splits, or a DatasetDict
        missing = [key for key in (data_cfg.train_split, data_cfg.eval_split) if key not in returned]
        if missing:
            raise UserError(
                f"{where} returned a mapping with the keys {list(returned)}, without {missing}: a mapping holds the "
                f"splits, dataset.train_split='{data_cfg.train_split}' and dataset.eval_split='{data_cfg.eval_split}'"
            )
        return (
            _function_table(returned[data_cfg.train_split], data_cfg, f"{where}, its split '{data_cfg.train_split}'"),
            _function_table(returned[data_cfg.eval_split], data_cfg, f"{where}, its split '{data_cfg.eval_split}'"),
        )
    table = _function_table(returned, data_cfg, where)
    return _carve(table, data_cfg, where, "return both splits, {'train': rows, 'test': rows}")


def _function_table(rows, data_cfg: DictConfig, where: str) -> Dataset:
    """The question and answer columns of what the function returned, or a UserError naming the key."""
    fields = list(dict.fromkeys([data_cfg.question_field, data_cfg.answer_field]))
    if isinstance(rows, Dataset):
        fields += [ENVIRONMENT_COLUMN] if ENVIRONMENT_COLUMN in rows.column_names else []
        missing = [
            f"dataset.{key}='{data_cfg[key]}'"
            for key in ("question_field", "answer_field")
            if data_cfg[key] not in rows.column_names
        ]
        if missing:
            raise UserError(f"{where}: {' and '.join(missing)}: no such column; columns: {rows.column_names}")
        table = rows.select_columns(fields)
    elif isinstance(rows, list | tuple):
        for index, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise UserError(f"{where}: row {index} is a {type(row).__name__}, not a dict: {FUNCTION_CONVENTION}")
            missing = [
                f"dataset.{key}='{data_cfg[key]}'"
                for key in ("question_field", "answer_field")
                if data_cfg[key] not in row
            ]
            if missing:
                raise UserError(f"{where}: row {index} has no {' and no '.join(missing)}; its keys: {list(row)}")
        fields += [ENVIRONMENT_COLUMN] if rows and all(ENVIRONMENT_COLUMN in row for row in rows) else []
        table = Dataset.from_dict(
            {field: ["" if row[field] is None else str(row[field]) for row in rows] for field in fields}
        )
    else:
        raise UserError(f"{where} returned a {type(rows).__name__}: {FUNCTION_CONVENTION}")
    if not len(table):
        raise UserError(f"{where} returned no rows: {FUNCTION_CONVENTION}")
    return table


def check_data_files(data_cfg: DictConfig) -> None:
    """Fail before any model loads when a data file is missing, unreadable, or does not hold what the config says
    (its question and answer columns; GSM8K-style answers), a hub dataset cannot be reached, a reasoning-gym task
    does not exist, or a dataset function cannot be imported or does not take dataset.function_args."""
    if data_cfg.source is not DataSource.function and (data_cfg.function or data_cfg.function_args):
        key = "dataset.function" if data_cfg.function else "dataset.function_args"
        raise UserError(
            f"{key} is read only with dataset=function (this run's dataset={data_cfg.name} takes its rows from "
            f"{data_cfg.source.value}): add dataset=function, or leave {key} out"
        )
    if data_cfg.source is DataSource.reasoning_gym:
        with reasoning_gym_raising(data_cfg):
            next(iter(_reasoning_gym_task(data_cfg, size=1)))  # its name and task_config, one problem generated
            if data_cfg.levels.enabled:
                level_ranges(data_cfg)  # each task's curriculum, the range of levels, the user's settings
        return
    if data_cfg.source is DataSource.function:
        check_data_function(data_cfg)  # what it returns is checked when it is called, before any model loads
        return
    if not data_cfg.path:
        raise UserError(f"dataset.path is required with dataset={data_cfg.name} (dataset.path=...)")
    files = [("dataset.eval_path", data_cfg.eval_path)] if data_cfg.eval_path else []
    if data_cfg.source is DataSource.files or Path(data_cfg.path).suffix in FILE_BUILDERS:
        files.insert(0, ("dataset.path", data_cfg.path))
    else:
        _check_hub(data_cfg)
    for key, path in files:
        _check_first_row(data_cfg, _first_row(path, key), key, path)
        _check_some_answer(data_cfg, key, path)


def _local_file(path: str, key: str) -> Path:
    """The file a setting names: it must exist and be of a type we read."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"{key}='{path}' does not exist")
    if file.suffix not in FILE_BUILDERS:
        raise UserError(f"{key}='{path}': unsupported file type; use one of {sorted(FILE_BUILDERS)}")
    return file


def _first_row(path: str, key: str) -> dict:
    """The file's first record, read without loading the whole file."""
    file = _local_file(path, key)
    try:
        if file.suffix == ".parquet":
            parquet = pq.ParquetFile(file)
            rows = parquet.read_row_group(0).slice(0, 1).to_pylist() if parquet.num_row_groups else []
        elif file.suffix == ".jsonl":
            with file.open(encoding="utf-8") as f:
                line = next((line for line in f if line.strip()), None)
            rows = [] if line is None else [json.loads(line)]
        else:
            rows = load_dataset("json", data_files=str(file), split="train").select(range(1)).to_list()
    except (OSError, ValueError, UnicodeDecodeError, pa.ArrowException, DatasetGenerationError) as err:
        raise UserError(f"{key}='{path}' could not be read as {file.suffix[1:]}: {str(err).splitlines()[0]}") from None
    if not rows or not isinstance(rows[0], dict):
        raise UserError(f"{key}='{path}' holds no records (one object per row, with a question and an answer)")
    return rows[0]


def _check_first_row(data_cfg: DictConfig, row: dict, key: str, path: str) -> None:
    for field in ("question_field", "answer_field"):
        if data_cfg[field] not in row:
            raise UserError(
                f"dataset.{field}='{data_cfg[field]}' is not a column of {key}='{path}'; columns: {list(row)}"
            )
    if data_cfg.answer_format is AnswerFormat.gsm8k and "####" not in str(row[data_cfg.answer_field]):
        raise UserError(
            f"dataset.answer_format=gsm8k, but the first answer in {key}='{path}' has no '#### <answer>' line; "
            "use dataset.answer_format=plain for answers that are the answer itself"
        )


def scorable(answer, data_cfg: DictConfig) -> bool:
    """An answer a completion can be scored against: not empty (nor null), GSM8K's final answer included."""
    if answer is None:
        return False
    text = gsm8k_final_answer(str(answer)) if data_cfg.answer_format is AnswerFormat.gsm8k else str(answer)
    return bool(text.strip())


def _answers(file: Path, field: str):
    """The file's answers, one by one (read lazily: the first one that is not empty is enough)."""
    if file.suffix == ".parquet":
        parquet = pq.ParquetFile(file)
        for group in range(parquet.num_row_groups):
            yield from parquet.read_row_group(group, columns=[field]).column(field).to_pylist()
    elif file.suffix == ".jsonl":
        with file.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    yield row.get(field) if isinstance(row, dict) else None
    else:
        yield from load_dataset("json", data_files=str(file), split="train")[field]


def _check_some_answer(data_cfg: DictConfig, key: str, path: str) -> None:
    """A file whose every answer is empty cannot be scored at all (no reward, no accuracy): refused, naming it."""
    try:
        if any(scorable(answer, data_cfg) for answer in _answers(Path(path).expanduser(), data_cfg.answer_field)):
            return
    except (OSError, ValueError, KeyError, pa.ArrowException, DatasetGenerationError) as err:
        raise UserError(f"{key}='{path}' could not be read: {str(err).splitlines()[0]}") from None
    what = " after '####'" if data_cfg.answer_format is AnswerFormat.gsm8k else ""
    raise UserError(
        f"{key}='{path}': every answer in its column dataset.answer_field='{data_cfg.answer_field}' is empty{what}, so "
        "no completion can be scored against it; fill in the answers, or point dataset.answer_field at the column "
        "that holds them"
    )


def _check_scorable(rows: list[dict], data_cfg: DictConfig, split: str) -> None:
    """The same for rows from any source (a hub dataset, a dataset function), once loaded, before any model loads."""
    if rows and not any(row["solution"].strip() for row in rows):
        source = data_cfg.function if data_cfg.source is DataSource.function else data_cfg.path
        key = "dataset.function" if data_cfg.source is DataSource.function else "dataset.path"
        raise UserError(
            f"{key}={source}: every answer of its {split} split in dataset.answer_field='{data_cfg.answer_field}' is "
            "empty, so no completion can be scored against it; fill in the answers, or point dataset.answer_field "
            "at the column that holds them"
        )


def load_splits(data_cfg: DictConfig) -> tuple[Dataset, Dataset]:
    if data_cfg.source is DataSource.reasoning_gym:
        with reasoning_gym_raising(data_cfg):
            train, held_out = _reasoning_gym_splits(data_cfg)
    else:
        train, held_out = _table_splits(data_cfg)
        _check_scorable(train, data_cfg, "training")
        _check_scorable(held_out, data_cfg, "held-out")
    if not train or not held_out:
        raise UserError(f"dataset '{data_cfg.name}' gave {len(train)} training and {len(held_out)} held-out rows")
    log.info("Dataset %s: %d training prompts, %d held-out", data_cfg.name, len(train), len(held_out))
    return Dataset.from_list(train), Dataset.from_list(held_out)


# A reasoning-gym stream of its own for benchmarks: far from any seed a user would pick for training.
BENCHMARK_SEED_OFFSET = 1_000_003


def unseen_problems(data_cfg: DictConfig, count: int, train: Dataset, held_out: Dataset) -> Dataset:
    """Up to `count` problems a run never trains on: for reasoning-gym, a distinct seeded stream of the same task
    without the training questions; for files, the hub and a function, the held-out split (it may hold fewer)."""
    if data_cfg.source is not DataSource.reasoning_gym:
        return held_out.select(range(min(count, len(held_out))))
    seen, found = set(train["question"]), {}
    with reasoning_gym_raising(data_cfg):
        items = _reasoning_gym_task(data_cfg, size=3 * count, seed=data_cfg.seed + BENCHMARK_SEED_OFFSET)
        for item in items:
            if item["question"] not in seen and len(found) < count:
                found.setdefault(item["question"], item)
    return Dataset.from_list(_task_rows(list(found.values()), data_cfg))


def _hub_id(cfg: DictConfig) -> bool:
    """dataset.source=hub with a dataset id (not local files, which are read as dataset=files reads them)."""
    data = cfg.dataset
    return data.source is DataSource.hub and Path(str(data.path or "")).suffix not in FILE_BUILDERS


def _dataset_here(cfg: DictConfig) -> str:
    return f"this run's dataset={cfg.dataset.name} has dataset.source={cfg.dataset.source.value}"


# Settings that act only given another (grpo_exp.config_rules; checked by grpo_exp.run.inert)
ONLY_WITH = (
    OnlyWith(
        ("dataset.task", "dataset.task_config", "dataset.tasks", "dataset.levels"),
        lambda cfg: cfg.dataset.source is DataSource.reasoning_gym,
        "for a reasoning-gym task (dataset.source=reasoning_gym)",
        _dataset_here,
        "use a reasoning-gym dataset (dataset=arith, chain_sum, legs, gsm_symbolic, reasoning_gym_mix)",
    ),
    OnlyWith(
        ("dataset.function", "dataset.function_args"),
        lambda cfg: cfg.dataset.source is DataSource.function,
        "with dataset=function",
        _dataset_here,
        "add dataset=function",
    ),
    OnlyWith(
        ("dataset.path",),
        lambda cfg: cfg.dataset.source in (DataSource.files, DataSource.hub),
        "for files or a hub dataset (dataset.source=files or hub)",
        _dataset_here,
        "use dataset=files (or a hub dataset)",
    ),
    OnlyWith(
        ("dataset.question_field", "dataset.answer_field"),
        lambda cfg: cfg.dataset.source is not DataSource.reasoning_gym,
        "for rows of files, a hub dataset or dataset=function (a reasoning-gym task has its own)",
        _dataset_here,
        "use dataset=files, dataset=function or a hub dataset",
    ),
    OnlyWith(
        ("dataset.eval_path",),
        lambda cfg: (
            cfg.dataset.source is DataSource.files or (cfg.dataset.source is DataSource.hub and not _hub_id(cfg))
        ),
        "for local files (dataset.source=files, or dataset.path a .jsonl/.json/.parquet file)",
        lambda cfg: _dataset_here(cfg) + (f" and dataset.path={cfg.dataset.path} (its splits)" if _hub_id(cfg) else ""),
        "use dataset=files with dataset.path",
    ),
    OnlyWith(
        ("dataset.hub_config",),
        _hub_id,
        "for a hub dataset id (dataset.source=hub)",
        _dataset_here,
        "use a hub dataset (dataset=gsm8k)",
    ),
    OnlyWith(
        ("dataset.train_split", "dataset.eval_split"),
        lambda cfg: _hub_id(cfg) or cfg.dataset.source is DataSource.function,
        "for a hub dataset's splits, or the mapping of splits a dataset function returns",
        _dataset_here,
        "use a hub dataset or dataset=function",
    ),
    OnlyWith(
        ("dataset.seed",),
        lambda cfg: not _hub_id(cfg),
        "to generate reasoning-gym problems and to carve the held-out split of files or a function's rows",
        lambda cfg: (
            f"this run's dataset={cfg.dataset.name} takes the hub's splits dataset.train_split and "
            "dataset.eval_split as they are"
        ),
        "use dataset=files (or leave the split to the hub)",
    ),
)
