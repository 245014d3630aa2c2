"""Classes of bad input (issue 34), each refused with one message naming the key the user typed and what is allowed,
before any model loads: several cases of each class, in-process where it can be (composition, then resolve), through
the command line where only that shows it (a user's config directory, evaluating from another directory)."""

import json
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from grpo_exp.data import check_data_files, load_splits
from grpo_exp.errors import UserError
from grpo_exp.paths import experiment_presets
from grpo_exp.run.build import build_parts
from grpo_exp.run.resolve import resolve
from grpo_exp.run.setting_paths import saved_path_overrides
from grpo_exp.run_files import latest_evaluation
from support.config import TINY_RUN, compose_config
from tests.helpers.cli import run_cli, run_command
from tests.helpers.modules import unseen_module_name

GRPO_EXP = Path(sys.executable).with_name("grpo-exp")
BASE = [*TINY_RUN, "logger=none"]


def refused(overrides: list[str]) -> str:
    with pytest.raises(UserError) as err:
        resolve(compose_config([*BASE, *overrides]), processes=1)
    message = str(err.value)
    assert "Traceback" not in message and len(message.splitlines()) <= 3, message
    return message


# ---- 1. a setting that has no effect given the others ------------------------------------------------------------

IGNORED = [  # (overrides, the key typed, the key that turns it off)
    (["eval.patience=3"], "eval.patience", "eval.every=0"),
    (["eval.every_problems=10"], "eval.every_problems", "eval.every=0"),
    (["eval.alarm=stop"], "eval.alarm", "eval.every=0"),
    (["eval.verification_benchmark.problems=50"], "eval.verification_benchmark.problems", "enabled=false"),
    (["rollout.max_turns=5"], "rollout.max_turns", "rollout=single"),
    (["rollout.tools=[calculator]"], "rollout.tools", "rollout=single"),
    (["rollout=multiturn", "rollout.environment_timeout_s=3"], "rollout.environment_timeout_s", "environment=null"),
    (["rollout=multiturn", "rollout.tools=[calculator]", "rollout.python.memory_mb=64"], "rollout.python", "tools"),
    (["judge.base_url=http://judge:8000/v1"], "judge.base_url", "reward=math has no judge"),
    (["judge=openai"], "judge.backend", "reward=math has no judge"),
    (["reward=math+judge", "judge.temperature=0.5"], "judge.temperature", "judge.mode=scores"),
    (["reward=math+judge", "judge.concurrency=2"], "judge.concurrency", "judge.backend=local"),
    (["scorer=genrm"], "scorer.name", "reward=math has neither"),
    (["reward=math+selfverify", "scorer.yes_token=Y"], "scorer.yes_token", "scorer.name=none"),
    (["reward=confidence", "scorer=self", "scorer.model=tiny"], "scorer.model", "scorer.name=self"),
    (["model.lora.r=8"], "model.lora.r", "model.lora.enabled=false"),
    (["model.name_or_path=some/model"], "model.name_or_path", "model.source=tiny"),
    (["trainer.max_resample_batches=8"], "trainer.max_resample_batches", "trainer.zero_variance_groups=skip"),
    (["trainer.warmup_steps=5"], "trainer.warmup_steps", "trainer.lr_scheduler_type=constant"),
    (["trainer.mismatch_clip_max=2.0"], "trainer.mismatch_clip_max", "mismatch_correction=null (the path's own)"),
    (["trainer.mismatch_correction=none", "trainer.mismatch_clip_min=0.5"], "mismatch_clip_min", "correction=none"),
    (["trainer.float64_reference_completions=8"], "float64_reference_completions", "float64_reference_every=0"),
    (["+experiment=textarena_guess", "probe.labels_check=stop"], "probe.labels_check", "rollout.environment"),
    pytest.param(
        ["generation=vllm_colocate", "trainer.extra.vllm_gpu_memory_utilization=0.5"],
        "trainer.extra.vllm_gpu_memory_utilization",
        "VLLM_CPU_KVCACHE_SPACE",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="read on a CUDA GPU"),
    ),
    pytest.param(
        ["generation=vllm_colocate", "trainer.extra.vllm_enable_sleep_mode=true"],
        "trainer.extra.vllm_enable_sleep_mode",
        "no sleep mode",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="read on a CUDA GPU"),
    ),
    (["dataset.path=train.jsonl"], "dataset.path", "dataset.source=reasoning_gym"),
    (["dataset.hub_config=main"], "dataset.hub_config", "dataset.source=reasoning_gym"),
    (["dataset=gsm8k", "dataset.seed=3"], "dataset.seed", "dataset=gsm8k"),
    (["dataset.function=my_data:rows"], "dataset.function", "dataset.source=reasoning_gym"),
    (["reward=math+selfverify", "reward.components.selfverify.every=2"], "selfverify.every", "schedule=joint"),
    (["reward=math+selfverify", "reward.components.selfverify.yes_share=0.3"], "yes_share", "balance=pairs"),
    (["stats.enabled=false", "stats.table_every=5"], "stats.table_every", "stats.enabled=false"),
    (["logger.tracking_uri=mlruns"], "logger.tracking_uri", "logger.backend=none"),
]


@pytest.mark.parametrize("overrides,key,switch", IGNORED)
def test_a_setting_this_run_would_ignore_is_refused_naming_both_keys(overrides, key, switch, no_model_loads):
    message = refused(overrides)
    assert key in message.split(" is read only ")[0] and switch in message, message
    assert "or leave" in message


ACTING = [
    ["eval.every=2", "eval.patience=3", "eval.alarm=stop"],
    ["rollout=multiturn", "rollout.max_turns=5", "rollout.tools=[calculator]"],
    ["eval.verification_benchmark.enabled=true", "eval.verification_benchmark.problems=50"],
    ["model.lora.enabled=true", "model.lora.r=8"],
    ["trainer.zero_variance_groups=resample", "trainer.max_resample_batches=8"],
    ["trainer.lr_scheduler_type=linear", "trainer.warmup_steps=1"],
    ["trainer.mismatch_correction=token_mask", "trainer.mismatch_clip_min=0.5", "trainer.mismatch_clip_max=2.0"],
    ["generation=vllm_async", "trainer.mismatch_clip_max=2.0"],  # generation ahead's token truncation reads it
    ["trainer.float64_reference_every=10", "trainer.float64_reference_completions=8"],
    ["reward=math+selfverify", "trainer.prompts_per_step=3", "scorer=self", "scorer.yes_token=Yes"],
    ["reward=math+judge", "judge.mode=text", "judge.temperature=0.5", "judge.model=tiny"],
]


@pytest.mark.parametrize("overrides", [[f"+experiment={name}"] for name in experiment_presets()] + ACTING)
def test_presets_defaults_and_settings_that_act_still_resolve(overrides, no_model_loads):
    resolve(compose_config([*overrides, "logger=none"]), processes=1)


# ---- 2. an error raised inside the user's own code at build time -------------------------------------------------

USER_MODULE = """
class Broken(Exception):
    pass


def make_reward(secret):
    raise Broken("no reward today")


def constant(completions, **kwargs):
    raise ValueError("cannot score")


def rows(n=10):
    raise KeyError("rows")


def empty_answers():
    return [{"question": f"q{i}", "answer": " "} for i in range(8)]
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = unseen_module_name("user_code")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in (name, f"{name}_broken"):
        sys.modules.pop(module, None)


def build_error(overrides: list[str]) -> str:
    with pytest.raises(UserError) as err:
        spec = resolve(compose_config([*BASE, *overrides]), processes=1)
        train, _ = load_splits(spec.cfg.dataset)
        parts = build_parts(spec, train["solution"])
        for reward in parts.reward_funcs:
            reward(prompts=["p"], completions=[[{"role": "assistant", "content": "x"}]], solution=["1"])
    return str(err.value)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["+reward.components.mine.factory={m}:make_reward", "+reward.components.mine.weight=1",
             "+reward.components.mine.settings.secret=hunter2"],
            "reward.components.mine.factory={m}:make_reward raised Broken: no reward today (called with the keys of "
            "reward.components.mine.settings ['secret'])",
        ),
        (
            ["dataset=function", "dataset.function={m}:rows"],
            "dataset.function={m}:rows raised KeyError: 'rows' (called with no dataset.function_args)",
        ),
        (
            ["+reward.components.mine.function={m}:constant", "+reward.components.mine.weight=1"],
            "reward component 'mine' ({m}:constant) raised ValueError: cannot score",
        ),
        (
            ["+reward.components.mine.function={m}_broken:f", "+reward.components.mine.weight=1"],
            "reward.components.mine.function={m}_broken:f: importing '{m}_broken' failed: RuntimeError: broken at",
        ),
        (
            ["rollout=multiturn", "rollout.tools=[{m}_broken:tool]"],
            "rollout.tools[0]={m}_broken:tool: importing '{m}_broken' failed: RuntimeError: broken at import",
        ),
    ],
)  # fmt: skip
def test_what_the_users_code_raises_is_one_message_naming_the_key(user_module, overrides, expected, no_model_loads):
    message = build_error([o.format(m=user_module) for o in overrides])
    assert expected.format(m=user_module) in message, message
    assert "hunter2" not in message and "Traceback" not in message


def test_the_command_line_prints_what_a_factory_raised_without_a_traceback(tmp_path):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(USER_MODULE))
    result = run_command(
        [GRPO_EXP, "train", *BASE, f"hydra.run.dir={tmp_path / 'run'}", "+reward.components.mine.weight=1",
         "+reward.components.mine.factory=my_rewards:make_reward", "+reward.components.mine.settings.secret=hunter2"],
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert result.returncode != 0
    assert "reward.components.mine.factory=my_rewards:make_reward raised Broken: no reward today" in result.stderr
    said = next(line for line in result.stderr.splitlines() if "raised Broken" in line)
    assert "hunter2" not in said and "Traceback" not in result.stderr  # (Hydra echoes the overrides typed, above it)
    assert "Loading model" not in result.stdout + result.stderr


# ---- 3. a path that exists but is the wrong kind -----------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["model=pretrained", "model.name_or_path={file}"], "model.name_or_path={file}: a file, where"),
        (["dataset=files", "dataset.path={dir}"], "dataset.path={dir}: a directory, where dataset.path names a"),
        (["dataset=files", "dataset.path={data}", "dataset.eval_path={dir}"], "dataset.eval_path={dir}: a directory"),
        (["reward=math+judge", "judge.rubric_file={dir}"], "judge.rubric_file={dir}: a directory, where"),
        (["reward=math+judge", "judge.model={file}"], "judge.model={file}: a file, where judge.model names"),
        (["cache_dir={file}"], "cache_dir={file}: a file, where cache_dir names the directory"),
        (["cache_dir={file}/models"], "cache_dir={file}/models: {file} is a file, so nothing can be under it"),
        (["outputs_dir={file}"], "outputs_dir={file}: a file, where outputs_dir names"),
        (["trainer.resume={file}"], "trainer.resume={file}: a file, where trainer.resume names"),
        (["model.chat_template={dir}"], "model.chat_template={dir}: a directory, where model.chat_template names"),
        (["logger=mlflow", "logger.tracking_uri={file}"], "logger.tracking_uri={file}: a file, where"),
    ],
)
def test_a_path_of_the_wrong_kind_is_refused_before_any_model_loads(tmp_path, overrides, expected, no_model_loads):
    paths = {"file": tmp_path / "a_file", "dir": tmp_path / "a_dir.jsonl", "data": tmp_path / "train.jsonl"}
    paths["file"].write_text("not a directory\n")
    paths["dir"].mkdir()
    write_rows(paths["data"], 9)
    message = refused([o.format(**paths) for o in overrides])
    assert expected.format(**paths) in message, message


# ---- 4. a config of the user's with a built-in's name ------------------------------------------------------------

SHADOWING = {
    "reward/format.yaml": "defaults:\n  - /reward_component/custom@components.format\n  - _self_\n"
    "components:\n  format:\n    weight: 1.0\n    function: my_rewards:brevity\n",
    "dataset/arith.yaml": "name: arith\nsource: files\npath: data.jsonl\n",
    "experiment/smoke.yaml": "# @package _global_\ntrainer:\n  beta: 0.5\n",
}


@pytest.mark.parametrize("config_path", sorted(SHADOWING))
@pytest.mark.parametrize("how", ["--config-dir", "hydra.searchpath"])
def test_a_config_of_yours_with_a_built_in_name_is_refused_naming_the_file(tmp_path, config_path, how):
    target = tmp_path / "configs" / config_path
    target.parent.mkdir(parents=True)
    target.write_text(SHADOWING[config_path])
    where = ["--config-dir", "configs"] if how == "--config-dir" else [f"hydra.searchpath=[file://{tmp_path}/configs]"]
    result = run_command([GRPO_EXP, "train", *where, "--cfg", "job"], cwd=tmp_path)
    assert result.returncode != 0
    group, name = config_path.removesuffix(".yaml").split("/")
    assert f"{tmp_path / 'configs'}/{config_path} has the name of grpo_exp's built-in {group}/{name}" in result.stderr
    assert f"rename it (e.g. {group}/my_{name}.yaml" in result.stderr and "Traceback" not in result.stderr


# ---- 5. a run's relative paths saved absolute: evaluated from anywhere -------------------------------------------


def write_rows(path: Path, rows: int = 12, answer=lambda i: str(i + 1)) -> Path:
    path.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": answer(i)}) + "\n" for i in range(rows)))
    return path


def test_the_saved_config_holds_absolute_paths_and_evaluation_reads_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "train.jsonl")
    spec = resolve(compose_config([*BASE, "dataset=files", "dataset.path=train.jsonl", "cache_dir=cache"]), processes=1)
    saved = spec.saved_config
    assert saved["dataset"]["path"] == str(tmp_path / "train.jsonl")
    assert saved["cache_dir"] == str(tmp_path / "cache") and saved["outputs_dir"] == str(tmp_path / "outputs")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(saved))
    overrides = saved_path_overrides(tmp_path / "run")
    assert f"dataset.path='{tmp_path / 'train.jsonl'}'" in overrides
    cfg = compose_config([*BASE, "dataset=files", "dataset.path=train.jsonl", *overrides])
    assert cfg.dataset.path == str(tmp_path / "train.jsonl")


@pytest.mark.e2e
def test_a_run_is_evaluated_from_another_directory(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "data").mkdir(parents=True)
    elsewhere.mkdir()
    write_rows(project / "data" / "train.jsonl", 16)
    run_dir = project / "run"
    train = run_command(
        [GRPO_EXP, "train", "model=tiny", "trainer=debug", "logger=none", "dataset=files",
         "dataset.path=data/train.jsonl", "dataset.eval_size=4", "eval.before=false", "eval.after=false",
         f"hydra.run.dir={run_dir}"],
        cwd=project,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["dataset"]["path"] == str(project / "data" / "train.jsonl")
    evaluate = run_command([GRPO_EXP, "evaluate", run_dir, "eval.samples=0"], cwd=elsewhere)
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    assert json.loads(latest_evaluation(run_dir).read_text())["problems"] == 4


# ---- 6. a number that is not finite ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override,key",
    [
        ("trainer.beta=inf", "trainer.beta=inf"),
        ("reward.components.math.weight=nan", "reward.components.math.weight=nan"),
        ("eval.temperature=-inf", "eval.temperature=-inf"),
        ("+trainer.extra.epsilon_high=inf", "trainer.extra.epsilon_high=inf"),
        ("algorithm=pass_at_k algorithm.threshold=nan", "algorithm.threshold=nan"),
        ("+model.architecture.rope_theta=nan", "model.architecture.rope_theta=nan"),
        ("eval.verification_benchmark.temperature=inf", "eval.verification_benchmark.temperature=inf"),
        ("judge.max_failure_rate=nan", "judge.max_failure_rate=nan"),
    ],
)
def test_a_float_that_is_not_finite_is_refused_naming_the_key(override, key, no_model_loads):
    assert f"{key}: must be a finite number" in refused(override.split())


# ---- 7. a data file whose answers cannot be scored ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name,answers,overrides",
    [
        ("train.jsonl", ["", " ", ""], []),
        ("train.jsonl", [None, None, None], []),
        ("train.jsonl", ["Because... #### ", "So #### ", "####"], ["dataset.answer_format=gsm8k"]),
        ("train.parquet", ["", "", ""], []),
        ("train.json", ["", "", ""], []),
    ],
)
def test_a_data_file_whose_answers_are_all_empty_is_refused_naming_it(tmp_path, name, answers, overrides):
    path = tmp_path / name
    rows = [{"question": f"q{i}", "answer": a} for i, a in enumerate(answers * 4)]
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif name.endswith(".json"):
        path.write_text(json.dumps(rows))
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = compose_config(["dataset=files", f"dataset.path={path}", "dataset.eval_size=2", *overrides])
    with pytest.raises(UserError) as err:
        check_data_files(cfg.dataset)
    assert f"dataset.path='{path}': every answer in its column dataset.answer_field='answer' is empty" in str(err.value)


def test_one_answer_is_enough_and_a_held_out_file_is_checked_too(tmp_path):
    train = write_rows(tmp_path / "train.jsonl", 6, answer=lambda i: "7" if i == 5 else "")
    held_out = write_rows(tmp_path / "eval.jsonl", 3, answer=lambda i: "")
    cfg = compose_config(["dataset=files", f"dataset.path={train}"])
    check_data_files(cfg.dataset)
    cfg = compose_config(["dataset=files", f"dataset.path={train}", f"dataset.eval_path={held_out}"])
    with pytest.raises(UserError, match=r"dataset.eval_path='.*eval.jsonl': every answer in its column"):
        check_data_files(cfg.dataset)


def test_a_dataset_function_whose_answers_are_all_empty_is_refused(user_module):
    cfg = compose_config(["dataset=function", f"dataset.function={user_module}:empty_answers", "dataset.eval_size=2"])
    with pytest.raises(UserError, match=r"dataset.function=.*:empty_answers: every answer of its training split"):
        load_splits(cfg.dataset)


def test_the_command_line_refuses_an_ignored_setting_without_a_traceback(tmp_path):
    result = run_cli(*BASE, f"hydra.run.dir={tmp_path}", "eval.patience=3")
    assert result.returncode != 0
    assert "eval.patience=3 is read only by validations while training" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Loading model" not in result.stderr + result.stdout


# ---- 8. a file a run directory holds, damaged: one message naming the file ----------------------------------------


@pytest.mark.parametrize(
    ("file", "content", "expected"),
    [
        ("overrides.yaml", "- a=1\n  b: [", "not YAML"),
        ("overrides.yaml", "trainer: {beta: 0.1}\n", "not a list"),
        ("overrides.yaml", "- {beta: 0.1}\n", "not a list of overrides"),
        ("hydra.yaml", "hydra: [unclosed\n", "not YAML"),
        ("hydra.yaml", "hydra:\n  runtime: 3\n", "not a Hydra run's hydra.yaml"),
    ],
)
def test_a_damaged_file_of_a_run_directory_is_named_with_what_is_wrong(tmp_path, file, content, expected):
    from grpo_exp.errors import DamagedFile
    from grpo_exp.evaluate import resolve_source

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "checkpoint-final").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- trainer.beta=0.1\n")
    (run_dir / ".hydra" / file).write_text(content)
    with pytest.raises(DamagedFile, match=expected) as refused:
        resolve_source([str(run_dir)])
    assert str(run_dir / ".hydra" / file) in str(refused.value)


def test_a_damaged_run_file_reaches_the_user_as_a_message_not_a_traceback(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "checkpoint-final").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- a=1\n  b: [")
    for command in ("evaluate", "probe"):
        result = run_command([GRPO_EXP, command, str(run_dir)], timeout=300)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "overrides.yaml: not YAML" in result.stderr


# ---- 9. an output or source argument of a command, checked before any work ----------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--out", "{file}"], "a file is there, not a directory"),
        (["--out", "{file}/compare"], "cannot be created"),
        (["--wandb", "my-team/grpo"], "--wandb: 'my-team/grpo' is not ENTITY/PROJECT/GROUP"),
        (["--wandb", "my-team//sweep"], "is not ENTITY/PROJECT/GROUP"),
    ],
)
def test_compare_refuses_an_output_or_source_it_cannot_use_before_reading_runs(tmp_path, capsys, argv, expected):
    from grpo_exp.compare import main

    runs = tmp_path / "runs"
    runs.mkdir()
    (tmp_path / "a_file").write_text("")
    argv = [arg.format(file=tmp_path / "a_file") for arg in argv]
    with pytest.raises(SystemExit) as stopped:
        main([str(runs), *argv])
    assert stopped.value.code == 2
    assert expected in capsys.readouterr().err


def _refused_by_the_system() -> Path:
    """A directory the operating system refuses to create though permission bits allow it (Linux's /sys: "Operation
    not permitted", even to root)."""
    target = Path("/sys/grpo_exp_output")
    try:
        target.mkdir()
    except OSError:
        return target
    target.rmdir()
    pytest.skip("this machine's /sys takes new directories: no path that the system refuses")


def test_an_output_directory_the_system_refuses_is_found_by_trying_not_by_permission_bits(tmp_path, monkeypatch):
    import errno
    import tempfile

    from grpo_exp.run_files import output_directory_problem

    assert output_directory_problem(tmp_path / "new" / "deeper") is None
    assert not (tmp_path / "new").exists()  # the check leaves nothing behind

    def refused(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    with monkeypatch.context() as patched:  # a file system that makes directories but refuses files (a cgroup's)
        patched.setattr(tempfile, "TemporaryFile", refused)
        refusal = output_directory_problem(tmp_path / "new")
        assert refusal == f"cannot be created in {tmp_path} (Operation not permitted)"
        assert list(tmp_path.iterdir()) == []  # the directory made to try it, removed
    monkeypatch.setattr(tempfile, "mkdtemp", refused)  # a mount that refuses whatever the bits say
    assert output_directory_problem(tmp_path / "new") == f"cannot be created in {tmp_path} (Operation not permitted)"
    assert output_directory_problem(tmp_path) == "cannot be written (Operation not permitted)"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["train", "outputs_dir={refused}"], "outputs_dir={refused} ({refused}/runs/"),
        (["train", "hydra.run.dir={refused}"], "hydra.run.dir={refused}: cannot be created in /sys"),
        (["train", "cache_dir={refused}"], "cache_dir={refused}: cannot be created in /sys"),
        (
            ["train", "-m", "outputs_dir={refused}", "trainer.beta=0.0,0.1"],
            "outputs_dir={refused} ({refused}/multirun/",
        ),
        (["train", "outputs_dir={file}"], "outputs_dir={file} ({file}/runs/"),
        (["probe", "outputs_dir={refused}"], "outputs_dir={refused} ({refused}/probe/"),
    ],
)
def test_an_output_directory_the_system_refuses_is_one_message_naming_what_the_user_wrote(tmp_path, argv, named):
    values = {"file": tmp_path / "a_file"}
    values["refused"] = _refused_by_the_system() if "{refused}" in " ".join(argv) else None
    (tmp_path / "a_file").write_text("")
    argv = [arg.format(**values) for arg in argv]
    result = run_command([GRPO_EXP, *argv], timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert named.format(**values) in result.stderr, result.stderr[-2000:]
    assert "give a directory this user can write to" in result.stderr


# ---- 10. what a library raises on the user's task settings: the key named, in the library's words -----------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (  # a range of word lengths with no word in it: reasoning-gym draws from an empty list
            ["+dataset.task_config.min_word_len=30", "+dataset.task_config.max_word_len=40"],
            "dataset.task_config for 'spell_backward' (min_word_len=30, max_word_len=40): reasoning-gym could not "
            "make its problems (IndexError",
        ),
        (["+dataset.task_config.data_file=no_such_words.txt"], "where the command runs"),
        (
            ["dataset.task=null", "+dataset.tasks.spell_backward={config: {data_file: nowhere.txt}}"],
            "dataset.tasks.spell_backward.config (data_file='nowhere.txt'): reasoning-gym could not make its problems",
        ),
        (  # in a mix: the task whose settings the library cannot use, with them
            [
                "dataset.task=null",
                "+dataset.tasks.chain_sum={weight: 1}",
                "+dataset.tasks.spell_backward={config: {min_word_len: 30, max_word_len: 40}}",
            ],
            "dataset.tasks.spell_backward.config (min_word_len=30, max_word_len=40): reasoning-gym could not make",
        ),
        (
            ["dataset.task=chain_sum", "+dataset.task_config.min_terms=5", "+dataset.task_config.max_terms=2"],
            "(min_terms=5, max_terms=2)",
        ),
    ],
)
def test_what_reasoning_gym_raises_on_the_task_settings_names_the_key(overrides, expected):
    from grpo_exp.data import check_data_files

    cfg = compose_config(["dataset=reasoning_gym", "dataset.task=spell_backward", *overrides])
    with pytest.raises(UserError) as refused:
        check_data_files(cfg.dataset)
    assert expected in str(refused.value), str(refused.value)


def test_a_relative_task_file_is_read_from_where_the_command_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_words.txt").write_text("\n".join(["apple", "banana", "cherry", "damson", "elder"]) + "\n")
    cfg = compose_config(
        ["dataset=reasoning_gym", "dataset.task=spell_backward", "+dataset.task_config.data_file=my_words.txt"]
    )
    train, heldout = load_splits(OmegaConf.merge(cfg.dataset, {"eval_size": 2}))
    words = {question.rsplit(" ", 1)[-1] for question in [*train["question"], *heldout["question"]]}
    assert words <= {"apple", "banana", "cherry", "damson", "elder"} and len(words) >= 3


@pytest.mark.parametrize(
    ("module", "argv", "expected"),
    [
        ("advice_change", ["{missing}", "{missing}"], "no such directory"),
        ("episodes_change", ["{empty}"], "a run directory without eval_before.jsonl"),
        ("answer_rules", ["--score-only", "--answers", "{missing}"], "no such file"),
        ("learning_curve", ["{missing}"], "no such directory"),
    ],
)
def test_the_benchmarks_commands_name_a_missing_run_file_before_any_work(tmp_path, capsys, module, argv, expected):
    import importlib

    main = importlib.import_module(f"benchmarks.{module}").main
    with pytest.raises(SystemExit) as stopped:
        main([arg.format(missing=tmp_path / "nowhere", empty=tmp_path) for arg in argv])
    assert stopped.value.code == 2 and expected in capsys.readouterr().err


# ---- 11. a key added with `+` that no setting has: refused, with the close ones -----------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+eval.evry=5", "eval.evry: no such setting, so nothing would read it (did you mean eval.every?"),
        ("+trainer.learning_rte=1e-4", "did you mean trainer.learning_rate?"),
        ("+rollout.environment_kwargs.code_length=3", "rollout.environment_kwargs: no such setting"),
        ("+seed=3", "seed: no such setting, so nothing would read it (the top-level settings: algorithm"),
    ],
)
def test_a_key_no_setting_has_is_refused_naming_it(override, expected, no_model_loads):
    assert expected in refused([override])


@pytest.mark.parametrize(
    "override",
    ["+trainer.extra.top_k=20", "+dataset.task_config.min_terms=3", "+reward.components.format.settings.x=1"],
)
def test_free_form_sections_take_new_keys(override, no_model_loads):
    cfg = compose_config([*TINY_RUN, "dataset=reasoning_gym", "logger=none", override])
    from grpo_exp.schema import check_values

    check_values(cfg)
