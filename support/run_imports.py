"""What a grpo_exp run imports: the modules that tests/helpers/warm.py's server imports once for every command it
forks, and whose bytecode support/compile_imports.py writes after an install. Module names only: importing this
module imports none of them."""

# Not grpo_exp.cli (nor any module a command runs): runpy warns when the module it runs is already imported.
IMPORTS = ("torch", "transformers", "trl", "datasets", "hydra", "grpo_exp.run.experiment")
# What a tiny training imports only when it runs, ~0.75 s a command (a rank of a launcher too) on 2 cores: scipy's
# statistics (the health alarms' intervals), W&B's run API (logger=wandb), the Llama modelling code (the tiny model
# and SmolLM2), Hydra's launcher and sweeper plug-ins (every run's plug-in scan), the sweep callback; math-verify and
# its LaTeX parser (latex2sympy2, antlr4), which the first reference read imports: 0.56 CPU-s of a tiny warm run's 5.5
# on the AVX2-only EPYC, in nearly every command of the tests.
RUN_IMPORTS = (
    "scipy.stats",
    "math_verify",
    "wandb.apis.public",
    "wandb.sdk.launch",
    "transformers.models.llama.modeling_llama",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher",
    "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper",
    "grpo_exp.run.sweep",
    "grpo_exp.run.trackers.wandb_run",
)
# Where installed (the dev extra): accelerate imports it in every training (extract_model_from_parallel), ~2 s each.
OPTIONAL_IMPORTS = ("deepspeed",)
