"""Compose every option of every config group, every reward mix of one to three components and every preset, and
write each composed config (as composed, then resolved) to a directory: diff two such directories to show that a
refactor left every composition as it was.

    python -m support.dump_configs /tmp/configs_before      (then again after the change, and diff -r the two)
"""

import argparse
import itertools
from pathlib import Path

from omegaconf import OmegaConf

from grpo_exp.paths import CONF_DIR, experiment_presets, reward_components
from support.config import compose_config


def cases() -> list[tuple[str, list[str]]]:
    groups = {g.name: sorted(p.stem for p in g.glob("*.yaml")) for g in CONF_DIR.iterdir() if g.is_dir()}
    groups.pop("hydra", None)
    components = reward_components()
    groups["reward"] = ["+".join(mix) for n in (1, 2, 3) for mix in itertools.combinations(components, n)]
    found = [("default", [])]
    found += [(f"{group}={option}", [f"{group}={option}"]) for group, options in groups.items() for option in options]
    return found + [(f"experiment={name}", [f"+experiment={name}"]) for name in experiment_presets()]


def dump(name: str, overrides: list[str]) -> str:
    try:
        cfg = compose_config(overrides)
    except Exception as err:  # a composition that fails must fail the same way after the change
        return f"ERROR {type(err).__name__}: {err}"
    text = OmegaConf.to_yaml(cfg)
    try:
        return text + "\n# resolved\n" + OmegaConf.to_yaml(OmegaConf.to_container(cfg, resolve=True))
    except Exception as err:
        return text + f"\n# resolve error {type(err).__name__}: {err}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    out_dir = parser.parse_args().out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    found = cases()
    for name, overrides in found:
        (out_dir / f"{name}.yaml").write_text(dump(name, overrides), encoding="utf-8")
    print(f"{len(found)} composed configs in {out_dir}")


if __name__ == "__main__":
    main()
