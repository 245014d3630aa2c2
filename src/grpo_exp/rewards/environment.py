"""Your environment's own score of each episode (rollout=environment): its get_reward() once the trajectory ended
(grpo_exp.rollout.environment), None (missing: imputed from its group, like any failed reward) where the episode
failed.
    grpo-exp train rollout=environment rollout.environment=my_env:Game reward=environment

On grpo_exp's loop the rollout hands the scores over (`env_reward`); on TRL's tool-calling loop
(rollout.tool_calling=native) TRL hands over the episodes' instances (`environments`, grpo_exp.rollout.native), each
finished here (the seam then logs the failed ones and spends them from the failure budget).
"""


def make_environment_reward():
    def environment(completions, env_reward=None, environments=None, **kwargs) -> list[float | None]:
        """Each episode's get_reward()."""
        if env_reward is not None:
            return list(env_reward)
        if environments is None:  # checked at resolve time: reward=environment needs rollout=environment
            raise ValueError("reward=environment scores episodes of rollout=environment; this batch has none")
        episodes = [instance.episode for instance in environments]
        for episode in episodes:
            episode.finish()
        return [episode.reward for episode in episodes]

    return environment
