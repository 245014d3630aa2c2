"""Your environment's own score of each episode (rollout=environment): its get_reward() once the trajectory ended
(grpo_exp.rollout.environment), or with `pays=success` 1 for an episode that succeeded (get_reward() at least
rollout.environment_success_at: a game won) and 0 for any other, whatever partial credit the environment gives.
None (missing: imputed from its group, like any failed reward) where the episode failed.
    grpo-exp train rollout=environment rollout.environment=my_env:Game reward=environment

On grpo_exp's loop the rollout hands the scores over (`env_reward`); on TRL's tool-calling loop
(rollout.tool_calling=native) TRL hands over the episodes' instances (`environments`, grpo_exp.rollout.native), each
finished here (the seam then logs the failed ones and spends them from the failure budget).
"""

from dataclasses import dataclass

from omegaconf import MISSING, DictConfig

from grpo_exp.errors import UserError
from grpo_exp.rewards.components import reward_component
from grpo_exp.schema import EpisodePay, RolloutName


@dataclass
class EnvironmentReward:
    # Your environment's own score of each episode, its get_reward() once the trajectory has ended (needs
    # rollout=environment); missing (imputed) for a failed episode.
    weight: float = MISSING
    # reward: get_reward() as it is | success: 1 for an episode that succeeded (get_reward() at least
    # rollout.environment_success_at: a game won), 0 for any other, whatever partial credit it was given
    pays: EpisodePay = EpisodePay.reward


def _check_in_run(settings: DictConfig, cfg: DictConfig, processes: int) -> None:
    if cfg.rollout.name is not RolloutName.multiturn or cfg.rollout.environment is None:
        raise UserError(
            "reward=...environment scores episodes of your environment: set rollout=environment "
            "rollout.environment=module:Class"
        )


@reward_component("environment", EnvironmentReward, check=_check_in_run)
def make_environment_reward(pays: str = "reward"):
    success_only = EpisodePay(pays) is EpisodePay.success

    def environment(completions, env_reward=None, env_success=None, environments=None, **kwargs) -> list[float | None]:
        """Each episode's get_reward() (pays=success: 1.0 where it succeeded, else 0.0)."""
        if env_reward is None:
            if environments is None:  # checked at resolve time: reward=environment needs rollout=environment
                raise ValueError("reward=environment scores episodes of rollout=environment; this batch has none")
            episodes = [instance.episode for instance in environments]
            for episode in episodes:
                episode.finish()
            env_reward, env_success = [e.reward for e in episodes], [e.success for e in episodes]
        if not success_only:
            return list(env_reward)
        return [None if r is None else float(won) for r, won in zip(env_reward, env_success, strict=True)]

    return environment
