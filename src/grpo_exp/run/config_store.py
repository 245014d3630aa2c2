"""The config's structured schemas in Hydra's ConfigStore, registered by every command before Hydra composes: the
run's (grpo_exp.schema.Schema), and each reward component's settings as registered beside its code
(conf/reward/<name>.yaml puts them under reward.components.<name>)."""

from hydra.core.config_store import ConfigStore

from grpo_exp.schema import CustomReward, Schema


def register_schemas() -> None:
    # The components' modules import transformers, which reads HF_HUB_OFFLINE at import: tests set it first
    # (tests/conftest.py imports this module before).
    from grpo_exp.rewards.registry import REWARD_COMPONENTS

    store = ConfigStore.instance()
    store.store(name="schema", node=Schema)
    for name, node in REWARD_COMPONENTS.items():
        store.store(group="reward_component", name=name, node=node)
    store.store(group="reward_component", name="custom", node=CustomReward)  # the user's own (CustomReward)
