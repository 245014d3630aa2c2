"""Old names that still work: each is translated to its new name, with one warning line on stderr naming both.

The P(Yes) scorer was once the `verifier` config group (verifier=math_verify | genrm | self, its settings
verifier.model, verifier.template...); it is the `scorer` group now (scorer=none | genrm | self, scorer.model...),
and `verifier` holds the run's correctness labels only (verifier.labels, verifier.labels_batched). The command
lines of `grpo-exp train` / `python -m grpo_exp.train` (sweeps included) and `grpo-exp evaluate` (and the overrides
an old run directory saved) are translated here before Hydra sees them; a saved config.yaml by `renamed_config`.

Settings that moved (RENAMED_KEYS) are translated the same way: a built-in environment scheme's own settings are a
section of their own, rollout.<scheme> (grpo_exp.environments.schemes), so rollout.invalid_move_credit is
rollout.textarena.invalid_move_credit.
"""

import copy
import re
import sys

# verifier=<old option> -> scorer=<new option>
SCORER_OPTIONS = {"math_verify": "none", "genrm": "genrm", "self": "self"}
# verifier.<key> -> scorer.<key>: the P(Yes) scorer's settings (verifier.labels, labels_batched stay)
SCORER_KEYS = ("name", "model", "template", "yes_token", "no_token", "batch_size", "base_url", "api_key_env")

# [+|++|~][hydra.sweeper.params.]verifier[.key][=value]
_OVERRIDE = re.compile(
    r"^(?P<prefix>\+\+|\+|~)?(?P<sweeper>hydra\.sweeper\.params\.)?verifier(?:\.(?P<key>\w+))?(?P<rest>=.*)?$",
    re.DOTALL,
)
# old dotted key -> its new one
RENAMED_KEYS = {"rollout.invalid_move_credit": "rollout.textarena.invalid_move_credit"}
# [+|++|~][hydra.sweeper.params.]<old key>[=value]
_RENAMED_KEY = re.compile(
    r"^(?P<prefix>\+\+|\+|~)?(?P<sweeper>hydra\.sweeper\.params\.)?(?P<key>"
    + "|".join(re.escape(key) for key in RENAMED_KEYS)
    + r")(?P<rest>=.*)?$",
    re.DOTALL,
)
_OLD_OPTION = re.compile(r"\b(" + "|".join(SCORER_OPTIONS) + r")\b")


def translate_override(override: str) -> tuple[str, str | None]:
    """(the override under its new name, the deprecation message; None where nothing was renamed)."""
    moved = _RENAMED_KEY.match(override)
    if moved is not None and (moved["rest"] is not None or moved["prefix"] == "~"):
        new = f"{moved['prefix'] or ''}{moved['sweeper'] or ''}{RENAMED_KEYS[moved['key']]}{moved['rest'] or ''}"
        return new, f"{override} is deprecated: use {new}"
    found = _OVERRIDE.match(override)
    if found is None or (found["rest"] is None and found["prefix"] != "~"):
        return override, None
    key, rest = found["key"], found["rest"] or ""
    if key is not None and key not in SCORER_KEYS:
        return override, None  # verifier.labels, verifier.labels_batched: the correctness labels, as they were
    if key is None and rest.startswith("={"):
        return override, None  # verifier={labels: ...}: the node's values, not an option
    if key in (None, "name"):  # an option of the group (a sweep's list or choice(...) too)
        rest = _OLD_OPTION.sub(lambda m: SCORER_OPTIONS[m[1]], rest)
    new = f"{found['prefix'] or ''}{found['sweeper'] or ''}scorer{'' if key is None else '.' + key}{rest}"
    return new, f"{override} is deprecated: use {new}"


# This process's overrides given under an old name: the new key -> the override as it was given (for messages)
GIVEN_AS: dict[str, str] = {}


def translate_overrides(overrides: list[str], where: str = "") -> list[str]:
    """The overrides under their new names; one warning line on stderr for each old one (`where`: whose they are,
    e.g. a run directory's saved overrides), each remembered in GIVEN_AS."""
    translated = []
    for override in overrides:
        new, message = translate_override(override)
        if message is not None:
            print(f"warning: {message}{f' ({where})' if where else ''}", file=sys.stderr)
            GIVEN_AS[_key(new)] = override
        translated.append(new)
    return translated


def _key(override: str) -> str:
    """`+hydra.sweeper.params.scorer.model=x` -> `scorer.model`."""
    return override.partition("=")[0].lstrip("+~").removeprefix("hydra.sweeper.params.")


def with_old_names(message: str) -> str:
    """A refusal that names a setting the user gave under its old name says so, so that the user finds what they
    wrote: "... (given as rollout.invalid_move_credit=true, its old name)"."""
    given = [old for new, old in GIVEN_AS.items() if re.search(rf"(?<![\w.]){re.escape(new)}(?![\w.])", message)]
    if not given:
        return message
    return f"{message} (given as {', '.join(given)}: {'its old name' if len(given) == 1 else 'their old names'})"


def translate_argv(argv: list[str]) -> list[str]:
    """A Hydra app's command line (sys.argv[1:]) under the new names: its overrides, not its flags' arguments
    (--config-dir DIR, --cfg job, -cn NAME...)."""
    translated, takes_value = [], False
    for arg in argv:
        if takes_value or arg.startswith("-"):
            translated.append(arg)
            takes_value = arg in _FLAGS_WITH_VALUE
            continue
        translated.extend(translate_overrides([arg]))
    return translated


# Hydra's flags that take the next argument as their value (hydra/_internal/utils.py's get_args_parser).
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c"}
_FLAGS_WITH_VALUE |= {"--package", "-p", "--experimental-rerun"}


def renamed_config(saved: dict) -> dict:
    """A run's saved config (config.yaml, as a dict) under the new names: an old run's verifier.name and P(Yes)
    settings under scorer (verifier=math_verify: scorer.name=none), its settings that moved under their new keys
    (RENAMED_KEYS). A config under the new names is returned as is."""
    return _moved_keys(_scorer_renamed(saved))


def _moved_keys(saved: dict) -> dict:
    """The saved config with each old key of RENAMED_KEYS that it holds moved to its new key (a copy)."""
    for old, new in RENAMED_KEYS.items():
        *old_parents, old_name = old.split(".")
        parent = saved
        for part in old_parents:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or old_name not in parent:
            continue
        saved = copy.deepcopy(saved)
        *parents, name = new.split(".")
        node = saved
        for part in old_parents:
            node = node[part]
        value = node.pop(old_name)
        node = saved
        for part in parents:
            node = node.setdefault(part, {})
        node.setdefault(name, value)
    return saved


def _scorer_renamed(saved: dict) -> dict:
    verifier = saved.get("verifier")
    if "scorer" in saved or not isinstance(verifier, dict) or "name" not in verifier:
        return saved
    scorer = {key: verifier[key] for key in SCORER_KEYS if key in verifier}
    scorer["name"] = SCORER_OPTIONS.get(scorer["name"], scorer["name"])
    labels = {key: value for key, value in verifier.items() if key not in SCORER_KEYS}
    renamed = {}
    for key, value in saved.items():
        renamed[key] = labels if key == "verifier" else value
        if key == "verifier":
            renamed["scorer"] = scorer
    return renamed
