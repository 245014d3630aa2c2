"""Who decides whether an answer is correct: the rule verifier, P(Yes) scorers, the self-verification task."""
