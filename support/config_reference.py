"""The option lists of docs/config-reference.md, generated from conf/ and the reward components' registry:
`python -m support.config_reference` rewrites them in place (the descriptions beside them are written by hand).

A row's options cell is `| \\`<group>\\` | <options>[; more, by hand] |`: the options, up to the first "; ", are
conf/<group>/'s files, the default (conf/config.yaml's) first; for `reward`, every registered component, then
"any `+`-joined mix"; for `verifier` (settings, not a group), the registered correctness labels and answer rules.
tests/test_docs.py checks that the committed page is what this writes, so an option added to conf/ or a component
registered fails the test until the page is regenerated.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
PAGE = ROOT / "docs" / "config-reference.md"
ROW = re.compile(r"^\| `(?P<group>[a-z_]+)` \| (?P<options>[^|]*?) \|", flags=re.MULTILINE)


def defaults() -> dict[str, str]:
    """Each group's default option, from conf/config.yaml's defaults list."""
    listed = yaml.safe_load((CONF / "config.yaml").read_text(encoding="utf-8"))["defaults"]
    return {group: option for entry in listed if isinstance(entry, dict) for group, option in entry.items()}


def verifier_options() -> str:
    """The verifier's two registries: correctness labels and answer rules, the schema's defaults first."""
    from grpo_exp.answers import AUTO
    from grpo_exp.answers import BUILT_IN as ANSWERS
    from grpo_exp.schema import VerifierSchema
    from grpo_exp.verification.labels import BUILT_IN as LABELS

    def listed(names: list[str], default: str) -> str:
        ordered = [default] + [name for name in names if name != default]
        return ", ".join(f"`{name}` (default)" if name == default else f"`{name}`" for name in ordered)

    defaults = VerifierSchema()
    return (
        f"`verifier.labels`: {listed(list(LABELS), defaults.labels)}, or your function (`verifier.labels_batched`: "
        f"called on a whole batch) — `verifier.answer`, how the final answer is read: "
        f"{listed([AUTO, *ANSWERS], defaults.answer)}, or your function"
    )


def options(group: str) -> str | None:
    """The options cell's generated part for `group` (None: not a config group of conf/)."""
    if group == "reward":
        from grpo_exp.rewards.registry import COMPONENTS

        return ", ".join(f"`{name}`" for name in COMPONENTS) + ", and any `+`-joined mix"
    if group == "verifier":  # not a config group: its settings' registries
        return verifier_options()
    directory = CONF / group
    if not directory.is_dir():
        return None
    names = sorted(path.stem for path in directory.glob("*.yaml"))
    default = defaults().get(group)
    ordered = [default] + [name for name in names if name != default] if default in names else names
    return ", ".join(f"`{name}` (default)" if name == default else f"`{name}`" for name in ordered)


def render(page: str) -> str:
    def row(match: re.Match) -> str:
        generated = options(match["group"])
        if generated is None:
            return match[0]
        _, separator, by_hand = match["options"].partition("; ")
        return f"| `{match['group']}` | {generated}{separator}{by_hand} |"

    return ROW.sub(row, page)


def main() -> int:
    page = PAGE.read_text(encoding="utf-8")
    PAGE.write_text(render(page), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}'s option lists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
