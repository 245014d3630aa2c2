"""Your environment's own score of each episode (rollout=environment): its get_reward() once the trajectory ended
(grpo_exp.rollout.environment), None (missing: imputed from its group, like any failed reward) where the episode
failed.
    grpo-exp train rollout=environment rollout.environment=my_env:Game reward=environment

On grpo_exp's loop the rollout hands the scores over (`env_reward`); on TRL's tool-calling loop
(rollout.tool_calling=native) TRL hands over the episodes' instances (`environments`, grpo_exp.rollout.native), each
finished here: failed episodes are logged and spent from the failure budget (`budget`, every process together).
"""

import logging

log = logging.getLogger(__name__)


def make_environment_reward(budget=None):
    def environment(completions, env_reward=None, environments=None, **kwargs) -> list[float | None]:
        """Each episode's get_reward()."""
        if env_reward is not None:
            return list(env_reward)
        if environments is None:  # checked at resolve time: reward=environment needs rollout=environment
            raise ValueError("reward=environment scores episodes of rollout=environment; this batch has none")
        episodes = [instance.episode for instance in environments]
        for episode in episodes:
            episode.finish()
        failures = sorted({episode.failure for episode in episodes if episode.failure is not None})
        for failure in failures:
            log.warning("Episode failed: %s", failure)
        if budget is not None:
            budget.spend(sum(episode.failure is not None for episode in episodes), len(episodes))
        return [episode.reward for episode in episodes]

    return environment
