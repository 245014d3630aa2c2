"""The registries are the one source of the built-ins' names: environment schemes, reward components, estimators."""

import pytest

from grpo_exp.environments.schemes import builtin_schemes, environment_scheme, scheme_of


def test_builtin_environment_schemes_are_registered_beside_their_code():
    from grpo_exp.environments import openenv, textarena

    schemes = builtin_schemes()
    assert set(schemes) == {textarena.PREFIX, openenv.PREFIX}
    assert schemes[textarena.PREFIX] is textarena.game
    assert schemes[openenv.PREFIX] is openenv.build
    assert scheme_of("textarena/GuessTheNumber-v0") == "textarena/"
    assert scheme_of("openenv/http://127.0.0.1:8000") == "openenv/"
    assert scheme_of("my_module:MyEnv") is None


def test_a_scheme_registers_once():
    with pytest.raises(ValueError, match="already registered"):
        environment_scheme("textarena/")(lambda rest, invalid_move_credit=False: None)
