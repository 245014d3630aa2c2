"""After the run: its diagnosis (why it did or did not learn), the comparison of runs and sweeps, and the alarms'
rules, read from run directories (grpo_exp.run_files). Below the run's lifecycle (grpo_exp.run), which reads them
during a run; it imports nothing of it."""
