"""Reward components, one module per family; `registry` maps the names of the `reward` group to them."""
