"""What the user gave a setting: a value that is neither the schema's default nor (but for a choice) one that a config
group option of conf/ gives it (judge=local's judge.max_new_tokens, model=tiny's model.architecture: choosing model=tiny
is not setting them). An option that says which option of its group was chosen (judge.backend, scorer.name) counts as
given unless it is the schema's default."""

import dataclasses
import functools
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpo_exp.paths import CONF_DIR
from grpo_exp.redaction import redact

CHOICE_KEYS = ("backend", "name", "source")  # what a group's option is: given unless the schema's default


def leaves(cfg: DictConfig, key: str) -> list[str]:
    """The options at `key`: itself, or every option under a section (a node typed by a schema dataclass)."""
    node = OmegaConf.select(cfg, key, throw_on_missing=False)
    if not isinstance(node, DictConfig) or not dataclasses.is_dataclass(OmegaConf.get_type(node)):
        return [key] if _exists(cfg, key) else []
    return [leaf for child in node for leaf in leaves(cfg, f"{key}.{child}")]


def _exists(cfg: DictConfig, key: str) -> bool:
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_missing=False) if parent else cfg
    return isinstance(node, DictConfig) and name in node


def _raw(value: Any) -> Any:
    """A default as YAML would write it (enums by name)."""
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, dict | list):
        return OmegaConf.to_container(OmegaConf.create({"v": value}), enum_to_str=True)["v"]
    return value


class Written:
    """The config as written (interpolations unresolved, enums by name), converted once: a check reads hundreds of
    its options, and converting a section per option was most of the resolve phase's time."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.tree = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
        self.schemas: dict[str, type | None] = {}  # a section's schema dataclass
        self.chosen: dict[str, Any] = {}

    def value(self, key: str) -> Any:
        node = self.tree
        for part in key.split("."):
            node = node[part]
        return node

    def given(self, key: str) -> bool:
        """The user gave `key` its value: neither the schema's default nor (but for a choice) a conf/ option's."""
        value = self.value(key)
        parent, _, name = key.rpartition(".")
        if value == _schema_default(self.schema(parent), name):
            return False
        if name in CHOICE_KEYS:
            return True
        return value not in _option_values(self, key)

    def schema(self, section: str) -> type | None:
        if section not in self.schemas:
            self.schemas[section] = OmegaConf.get_type(OmegaConf.select(self.cfg, section) if section else self.cfg)
        return self.schemas[section]

    def chosen_option(self, group: str) -> Any:
        """The option chosen in `group` (CHOSEN_BY)."""
        if group not in self.chosen:
            chosen = OmegaConf.select(self.cfg, f"{group}.{CHOSEN_BY[group]}")
            self.chosen[group] = getattr(chosen, "value", chosen)
        return self.chosen[group]


@functools.cache
def _schema_default(schema: type | None, name: str) -> Any:
    """The default a schema dataclass gives its field `name` (as YAML would write it); _NO_DEFAULT where none."""
    found = {f.name: f for f in dataclasses.fields(schema)}.get(name) if dataclasses.is_dataclass(schema) else None
    if found is None:
        return _NO_DEFAULT
    if found.default is not dataclasses.MISSING:
        default = found.default
    elif found.default_factory is not dataclasses.MISSING:
        default = found.default_factory()
    else:
        return _NO_DEFAULT
    if dataclasses.is_dataclass(default):
        return OmegaConf.to_container(OmegaConf.structured(default), enum_to_str=True)
    return _raw(default)


_NO_DEFAULT = object()


# The option chosen in these groups is known from the composed config: only its file's values count there.
CHOSEN_BY = {"dataset": "name", "model": "name", "rollout": "name", "scorer": "name", "judge": "backend"}
CHOSEN_BY |= {"logger": "backend"}


@functools.cache
def _option_files() -> tuple[tuple[str, str, DictConfig], ...]:
    """Every option file of conf/'s config groups, (its group, its name, its values placed at its package: its
    group's path, or its header's)."""
    placed = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        group = path.parent.relative_to(CONF_DIR)
        if not group.parts or group.parts[0] == "hydra":
            continue
        text = path.read_text(encoding="utf-8")
        header = next((line for line in text.splitlines() if line.startswith("# @package")), None)
        package = header.split()[-1] if header else ".".join(group.parts)
        values = OmegaConf.create(text)
        if not isinstance(values, DictConfig):
            continue
        values.pop("defaults", None)
        values = values if package == "_global_" else OmegaConf.create(_nest(package, values))
        placed.append(("/".join(group.parts), path.stem, values))
    return tuple(placed)


def _nest(package: str, values: DictConfig) -> dict:
    nested: Any = values
    for part in reversed(package.split(".")):
        nested = {part: nested}
    return nested


def _option_values(written: Written, key: str) -> list[Any]:
    """The values conf/'s options give `key`: in a group whose chosen option the config names (CHOSEN_BY), that
    option's alone."""
    found = []
    parent, _, name = key.rpartition(".")
    for group, option, values in _option_files():
        chosen = written.chosen_option(group) if group in CHOSEN_BY else None
        if chosen is not None and chosen != option:
            continue
        node = OmegaConf.select(values, parent, throw_on_missing=False) if parent else values
        if isinstance(node, DictConfig) and name in node:
            found.append(OmegaConf.to_container(node, resolve=False)[name])
    return found


def shown(written_value: Any, key: str) -> str:
    """The value for the message: a secret's masked, a long one cut."""
    name = key.rpartition(".")[2]
    value = redact({name: written_value})[name]
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
