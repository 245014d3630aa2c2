"""Who decides whether an answer is correct: the correctness labels (labels.py, rule.py), P(Yes) scorers, the
self-verification task."""
