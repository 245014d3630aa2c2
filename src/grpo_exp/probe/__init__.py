"""The reward probe (`grpo-exp probe`, or before a run with probe.before_training): every reward component of the
mix, and the mix itself, scored on a battery of adversarial completions to held-out problems beside a right and a
plainly wrong answer to the same problems, before a single step is paid for. attacks.py builds the battery,
findings.py decides what is a finding (pure), battery.py scores it with the run's own reward functions."""
