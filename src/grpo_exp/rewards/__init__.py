"""Reward components, one module per family; `registry` maps the names of the `reward` group to them."""

# Components whose score grades an answer (learned ones): logged as <name>/mean, <name>/group_std, <name>/auroc every
# step, and watched by validations (their held-out mean and AUROC can drift from the truth).
GRADED_COMPONENTS = frozenset({"judge", "confidence"})
