"""Your environment's own score of each episode (rollout=environment): its get_reward() once the trajectory ended
(grpo_exp.rollout.environment), None (missing: imputed from its group, like any failed reward) where the episode
failed.
    grpo-exp train rollout=environment rollout.environment=my_env:Game reward=environment
"""


def make_environment_reward():
    def environment(completions, env_reward=None, **kwargs) -> list[float | None]:
        """Each episode's get_reward()."""
        if env_reward is None:  # checked at resolve time: reward=environment needs rollout=environment
            raise ValueError("reward=environment scores episodes of rollout=environment; this batch has none")
        return list(env_reward)

    return environment
