"""A Hydra config source for the configs that are composed rather than written out.

- `reward/<a>+<b>+...`: any `+`-joined mix of single components is a valid option of the `reward` group (also
  inside a multirun sweep). The mix is a config whose defaults list is its parts, `/reward/<part>@_here_` in
  order, so Hydra itself loads each part from the first directory of the config search path that has it: conf/reward/
  or the user's own (`--config-dir DIR`, `hydra.searchpath=[file://DIR]`), each part putting its typed schema in
  place through its own defaults list.
- `experiment/<name>`: the presets kept in the repository's top-level experiments/ directory (the user's own
  experiment/<name>.yaml in their config directory is found by Hydra's own file source, first when given by
  `--config-dir`).

A config of the user's own (in `--config-dir DIR` or `hydra.searchpath`) with the name of a built-in one (conf/'s
reward/format.yaml, dataset/arith.yaml..., experiments/' presets) is refused, naming the file: Hydra would take the
built-in (conf/ comes first on the search path) and ignore the user's without a word.

conf/config.yaml puts `grpo-exp://virtual` on its search path, and so does GrpoExpSearchPathPlugin wherever the
primary config directory is grpo_exp's conf/ (an override `hydra.searchpath=[...]` replaces the config's list): only
grpo_exp's app sees this source.
"""

import builtins
import sys
from pathlib import Path

from hydra._internal.sources_registry import SourcesRegistry
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from hydra.errors import ConfigCompositionException
from hydra.plugins.config_source import ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from grpo_exp.paths import CONF_DIR, EXPERIMENTS_DIR, MIX_SEPARATOR, experiment_presets, reward_components

SCHEME = "grpo-exp"
REWARD = "reward"


def _strip_yaml(config_path: str) -> str:
    return config_path[: -len(".yaml")] if config_path.endswith(".yaml") else config_path


def _split(config_path: str) -> tuple[str, str]:
    group, _, name = _strip_yaml(config_path).partition("/")
    return group, name


def _search_path_being_initialised() -> list[tuple[str, str]] | None:
    """The config search path that Hydra's ConfigRepository.initialize_sources(config_search_path) is turning into
    sources, this one among them: the directories (the user's too) where the parts of a mix may be. A ConfigSource
    is given only its own path, so it is read from the caller's frame (Hydra 1.3, pinned in pyproject.toml)."""
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        search_path = frame.f_locals.get("config_search_path")
        if isinstance(search_path, ConfigSearchPath):
            return [(element.provider, element.path) for element in search_path.get_path()]
        frame = frame.f_back
    return None


class GrpoExpConfigSource(ConfigSource):
    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)
        # Where to look for a mix's parts; without a search path (not built by Hydra's repository), conf/ alone.
        self._search_path = _search_path_being_initialised() or [("main", f"file://{CONF_DIR}")]
        self._sibling_sources: list[ConfigSource] | None = None
        self._refuse_shadowing()

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        return config_path in (REWARD, "experiment")

    def is_config(self, config_path: str) -> bool:
        group, name = _split(config_path)
        if group == REWARD:
            # Claim every mix, even one with an unknown part, so that load_config can name the known ones.
            return MIX_SEPARATOR in name
        return group == "experiment" and (EXPERIMENTS_DIR / f"{name}.yaml").is_file()

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        if results_filter == ObjectType.GROUP:
            return []
        if config_path == "experiment":
            return experiment_presets()
        return []

    def load_config(self, config_path: str) -> ConfigResult:
        group, name = _split(config_path)
        if group == "experiment":
            path = EXPERIMENTS_DIR / f"{name}.yaml"
            text = path.read_text(encoding="utf-8")
            return ConfigResult(
                config=OmegaConf.create(text),
                path=f"file://{EXPERIMENTS_DIR}",
                provider=self.provider,
                header=self._get_header_dict(text),
            )
        parts = name.split(MIX_SEPARATOR)
        known = self.known_components()
        unknown = [p for p in parts if p not in known]
        if unknown or len(set(parts)) != len(parts):
            problem = f"unknown component(s) {unknown}" if unknown else "a component is repeated"
            # A compact Hydra error: printed as one message, without a stack trace.
            raise ConfigCompositionException(
                f"reward={name}: {problem}. A reward mix joins distinct components with '+'; "
                f"known components: {', '.join(known)}"
            )
        # Each part from wherever Hydra finds reward/<part>.yaml, at the mix's own package (`reward`).
        defaults = [f"/{REWARD}/{part}@_here_" for part in parts]
        return ConfigResult(
            config=OmegaConf.create({"defaults": [*defaults, "_self_"]}),
            path=f"{self.scheme()}://{self.path}",
            provider=self.provider,
            header={"package": None},
        )

    def known_components(self) -> builtins.list[str]:
        """The single components: reward/<name>.yaml in every directory of the search path (the user's included)."""
        names = set(reward_components())
        for source in self._siblings():
            if source.is_group(REWARD):
                names.update(source.list(REWARD, ObjectType.CONFIG))
        return sorted(n for n in names if MIX_SEPARATOR not in n)

    def _refuse_shadowing(self) -> None:
        """A config directory of the user's must not hold a config with a built-in's path (Hydra would ignore it)."""
        built_in = built_in_configs()
        for source in self._siblings():
            if source.scheme() == "file" and Path(source.path).resolve() == CONF_DIR.resolve():
                continue
            if source.scheme() == "pkg" and source.path.startswith("hydra.conf"):
                continue
            where = source.path if source.scheme() == "file" else source.full_path()
            if source.is_group("verifier"):  # the P(Yes) scorer's group was `verifier` (grpo_exp.deprecated)
                raise ConfigCompositionException(
                    f"{where}/verifier/: the P(Yes) scorer's options are the `scorer` group now: move them to "
                    "scorer/ (their settings under scorer.*; verifier.labels stays, a setting, not a group)"
                )
            for config_path in built_in:
                if source.is_config(config_path):
                    group, _, name = config_path.rpartition("/")
                    renamed = f"{group}/my_{name}.yaml" if group else f"my_{name}.yaml"
                    component = f" and its component components.my_{name}" if group == REWARD else ""
                    raise ConfigCompositionException(
                        f"{where}/{config_path}.yaml has the name of grpo_exp's built-in "
                        f"{config_path}: Hydra takes the built-in one and would ignore yours. Built-in names are "
                        f"refused for your own configs: rename it (e.g. {renamed}{component})"
                    )

    def _siblings(self) -> builtins.list[ConfigSource]:
        """The search path's other sources (as Hydra's repository makes them), made once, when a mix first needs
        them."""
        if self._sibling_sources is None:
            Plugins.instance()  # registers the file://, pkg:// and structured:// source types (done by Hydra already)
            self._sibling_sources = []
            for provider, path in self._search_path:
                scheme = path.split("://", 1)[0] if "://" in path else "file"
                if scheme == SCHEME:
                    continue
                source_type = SourcesRegistry.instance().resolve(scheme)
                self._sibling_sources.append(source_type(provider, path))
        return self._sibling_sources


def built_in_configs() -> builtins.list[str]:
    """The config paths grpo_exp ships: every option of conf/'s groups (hydra/ aside), the primary config and the
    experiments/ presets."""
    options = [
        str(path.relative_to(CONF_DIR).with_suffix(""))
        for path in CONF_DIR.rglob("*.yaml")
        if path.relative_to(CONF_DIR).parts[0] != "hydra"
    ]
    return sorted(options) + [f"experiment/{name}" for name in experiment_presets()]


class GrpoExpSearchPathPlugin(SearchPathPlugin):
    """Puts grpo_exp's config source on the search path of grpo_exp's app (primary config directory: conf/), even
    when the command line replaces `hydra.searchpath` (e.g. hydra.searchpath=[file://DIR] for the user's configs)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        ours = str(CONF_DIR)
        if any((element.path or "").removeprefix("file://") == ours for element in search_path.get_path()):
            search_path.append(provider="grpo-exp", path=f"{SCHEME}://virtual")
