"""logger=mlflow: a run in logger.tracking_uri (by default a local store in <outputs_dir>/mlflow), in one experiment
per sweep (<project>/<sweep dir>; a single run's: <project>), named by what differs, tagged with its group. TRL's
MLflowCallback logs into it; the config goes in as params (flattened) and config.json, the sample tables as one
table artifact per key (rows appended at each step); MLflow has no histograms (their scalar summaries are metrics).

A resumed attempt opens a new run tagged grpo_exp.resumed_from: MLflow refuses to change a logged param, and
TrainingArguments (logged by the callback) name each attempt's directory."""

import re
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH
from transformers.integrations import MLflowCallback

from grpo_exp.errors import UserError
from grpo_exp.redaction import redact
from grpo_exp.run.trackers.base import RunInfo, TrackerRun, WithoutMissingValues, flatten, replace_callback, table


class ActiveRunCallback(WithoutMissingValues, MLflowCallback):
    """MLflowCallback: it logs into the active run (this one) and leaves it for the Tracker to end."""


class MlflowRun(TrackerRun):
    def __init__(self, logger_cfg, info: RunInfo):
        self.tracking_uri, artifacts = tracking_store(logger_cfg.tracking_uri)
        group = info.group.lstrip("/") if info.group else None
        self.experiment = f"{logger_cfg.project}/{group}" if group else logger_cfg.project
        tags = {"grpo_exp.group": info.group or "", "grpo_exp.job_type": info.job_type, **tag_values(info.tags)}
        if info.run_id:
            tags["grpo_exp.resumed_from"] = info.run_id
        try:
            if self.tracking_uri:
                mlflow.set_tracking_uri(self.tracking_uri)
            experiment_id = _experiment_id(self.experiment, artifacts)
        except MlflowException as err:
            raise UserError(f"logger.tracking_uri={logger_cfg.tracking_uri}: {err.message}") from err
        self.run = mlflow.start_run(experiment_id=experiment_id, run_name=info.name, tags=tags)
        params = [(_key(k), str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in flatten(info.config).items()]
        for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(params[start : start + MAX_PARAMS_TAGS_PER_BATCH]))
        mlflow.log_dict(info.config, "config.json")

    def attach(self, trainer) -> None:
        replace_callback(trainer, MLflowCallback, ActiveRunCallback())

    def log_table(self, step: int, key: str, rows: list[dict]) -> None:
        columns, data = table(rows)
        mlflow.log_table({c: [row[i] for row in data] for i, c in enumerate(columns)}, artifact_file=f"{key}.json")

    def summary(self, values: dict[str, float]) -> None:
        mlflow.log_metrics({_key(f"summary/{key}"): value for key, value in values.items()})

    def identity(self) -> dict:
        info = self.run.info
        return {"mlflow_run_id": info.run_id, "mlflow_run_name": info.run_name, "mlflow_experiment": self.experiment}

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    def where(self) -> str:
        uri = redact(mlflow.get_tracking_uri())  # a server's URL may carry credentials
        browse = f"open {uri}" if uri.startswith("http") else f"mlflow ui --backend-store-uri {uri}"
        return f"MLflow run {self.run.info.run_name} in experiment {self.experiment} ({uri}); browse: {browse}"

    def finish(self, failed: bool) -> None:
        mlflow.end_run(status="FAILED" if failed else "FINISHED")


def tracking_store(uri: str | None) -> tuple[str | None, str | None]:
    """(tracking URI, artifact location of new experiments). A directory becomes a local store in it: mlflow.db
    (SQLite: MLflow 3.17 refuses its file store unless MLFLOW_ALLOW_FILE_STORE=true) and artifacts/. A URI is
    MLflow's to read; None: MLflow's own default ($MLFLOW_TRACKING_URI)."""
    if uri is None or "://" in uri or uri.startswith("databricks"):
        return uri, None
    directory = Path(uri).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory / 'mlflow.db'}", (directory / "artifacts").as_uri()


def _experiment_id(name: str, artifact_location: str | None) -> str:
    client = MlflowClient()
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:  # created meanwhile by a parallel job of the same sweep
        return client.get_experiment_by_name(name).experiment_id


def tag_values(tags: list[str]) -> dict[str, str]:
    """Tags as MLflow's key/value pairs: "model:tiny" -> {"model": "tiny"}, "baseline" -> {"baseline": ""}."""
    return {_key(key): value for key, _, value in (tag.partition(":") for tag in tags)}


def _key(key: str) -> str:
    """MLflow's names allow letters, digits and _ - . / : and spaces (pass@k -> pass_k)."""
    return re.sub(r"[^0-9A-Za-z_\-. /:]", "_", key)
