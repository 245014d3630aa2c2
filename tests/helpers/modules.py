"""Names for the users' modules that tests write and import."""

import uuid


def unseen_module_name(prefix: str) -> str:
    """`prefix` and a suffix no other module has: a name no earlier test imported (Python keeps an imported module
    for the session). Not the test's tmp_path's name: a passed test's tmp_path is deleted (pyproject.toml's
    tmp_path_retention_policy), and pytest numbers a later test's of the same name from what is left, so the name
    comes again (with pytest 9.1 two parametrised tests in one worker imported the first one's module)."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"
