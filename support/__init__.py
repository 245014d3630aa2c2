"""What tests and benchmarks share: composing the config, the tiny model on disk, local servers, reward cases.

Not shipped with grpo_exp (packaging finds src/ only); importable from the repository root, where pytest and
`python -m benchmarks.X` run. Importing any module here changes nothing: callers set what they need.
"""
