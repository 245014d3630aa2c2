"""A Hydra config source for the configs that are composed rather than written out.

- `reward/<a>+<b>+...`: any `+`-joined mix of the single components in conf/reward/ is a valid option
  of the `reward` group (also inside a multirun sweep); the components' files (and their schemas) are
  merged in order.
- `experiment/<name>`: the presets kept in the repository's top-level experiments/ directory.

conf/config.yaml puts `grpo-exp://virtual` on its search path, so only grpo_exp's app sees this source.
"""

from hydra.core.object_type import ObjectType
from hydra.errors import ConfigCompositionException
from hydra.plugins.config_source import ConfigResult, ConfigSource
from omegaconf import OmegaConf

from grpo_exp.paths import (
    EXPERIMENTS_DIR,
    MIX_SEPARATOR,
    REWARD_DIR,
    experiment_presets,
    reward_components,
)


def _strip_yaml(config_path: str) -> str:
    return config_path[: -len(".yaml")] if config_path.endswith(".yaml") else config_path


def _split(config_path: str) -> tuple[str, str]:
    group, _, name = _strip_yaml(config_path).partition("/")
    return group, name


class GrpoExpConfigSource(ConfigSource):
    @staticmethod
    def scheme() -> str:
        return "grpo-exp"

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        return config_path in ("reward", "experiment")

    def is_config(self, config_path: str) -> bool:
        group, name = _split(config_path)
        if group == "reward":
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
        known = reward_components()
        unknown = [p for p in parts if p not in known]
        if unknown or len(set(parts)) != len(parts):
            problem = f"unknown component(s) {unknown}" if unknown else "a component is repeated"
            # A compact Hydra error: printed as one message, without a stack trace.
            raise ConfigCompositionException(
                f"reward={name}: {problem}. A reward mix joins distinct components with '+'; "
                f"known components: {', '.join(known)}"
            )
        # Each component file puts its typed schema in place through its defaults list: the mix keeps them all.
        files = [OmegaConf.load(REWARD_DIR / f"{p}.yaml") for p in parts]
        defaults = [d for f in files for d in f.pop("defaults", []) if d != "_self_"]
        merged = OmegaConf.merge(*files)
        merged.defaults = [*defaults, "_self_"]
        return ConfigResult(
            config=merged,
            path=f"{self.scheme()}://{self.path}",
            provider=self.provider,
            header={"package": None},
        )
