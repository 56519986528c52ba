"""Megatron's gradient-accumulation fusion and apex on the training machine (backends/megatron_grad_fusion.py): a
Python-only apex would make megatron-core stop while building the model, so the launch turns the fusion off and
says why; no apex at all costs speed, which the launch says; a recipe that sets the flag itself is left alone."""
import pytest
from megatron_args import H200X8_AS_MEGATRON_LORA
from test_backends_megatron import H200X8, MOE_35B, flag
from test_backends_megatron import megatron_parser_available as parser_check

from swift_vora.backends import megatron_grad_fusion
from swift_vora.backends.launch import build_launch
from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import load_recipe


def installed(*names):
    return lambda name: name in names


def megatron_launch(monkeypatch, have, *overrides):
    monkeypatch.setattr(megatron_grad_fusion, '_installed', installed(*have))
    recipe = load_recipe(H200X8, [f'model.path={MOE_35B}', *H200X8_AS_MEGATRON_LORA, *overrides])
    plan = plan_recipe(recipe)
    assert plan.verdict == 'fits', plan.reasons
    return build_launch(plan, recipe, environ={})


def test_the_three_installs():
    full = megatron_grad_fusion.check([], installed('apex', megatron_grad_fusion.EXTENSION))
    assert (full.args, full.note) == ([], None)
    python_only = megatron_grad_fusion.check([], installed('apex'))
    assert python_only.args == ['--gradient_accumulation_fusion', 'false'] and '--cuda_ext' in python_only.note
    absent = megatron_grad_fusion.check([], installed())
    assert absent.args == [] and 'apex is not installed' in absent.note and '--cuda_ext' in absent.note


@pytest.mark.parametrize('extra', [['--gradient_accumulation_fusion', 'true'],
                                   ['--gradient_accumulation_fusion=false']])
def test_a_recipe_that_sets_the_flag_is_left_as_it_is(extra):
    got = megatron_grad_fusion.check(extra, installed('apex'))
    assert (got.args, got.note) == ([], None)


def test_python_only_apex_turns_the_fusion_off_in_the_command(monkeypatch):
    launch = megatron_launch(monkeypatch, ['apex'])
    assert flag(launch.argv, '--gradient_accumulation_fusion') == 'false'
    assert any('without its CUDA extension' in n for n in launch.notes)
    # the user's own setting comes last and is the only one (argparse: the last occurrence wins)
    launch = megatron_launch(monkeypatch, ['apex'], 'extra_args=["--gradient_accumulation_fusion", "true"]')
    assert launch.argv.count('--gradient_accumulation_fusion') == 1
    assert flag(launch.argv, '--gradient_accumulation_fusion') == 'true'


def test_without_apex_the_command_is_unchanged_and_the_note_says_what_it_costs(monkeypatch):
    launch = megatron_launch(monkeypatch, [])
    assert '--gradient_accumulation_fusion' not in launch.argv
    assert any('apex is not installed' in n for n in launch.notes)
    with_apex = megatron_launch(monkeypatch, ['apex', megatron_grad_fusion.EXTENSION])
    assert with_apex.argv == launch.argv and not any('apex' in n for n in with_apex.notes)


def test_full_sft_gets_the_same_check(monkeypatch):
    launch = megatron_launch(monkeypatch, ['apex'], 'train.backend=megatron_ep_full', 'train.tuner=full',
                             'train.micro_batch=1')
    assert flag(launch.argv, '--gradient_accumulation_fusion') == 'false'


megatron_parser_available = parser_check  # the fixture, under the name the test asks for


def test_the_flag_parses_with_megatron_swift_arguments(monkeypatch, megatron_parser_available):
    from megatron_args import validate_argv
    launch = megatron_launch(monkeypatch, ['apex'])
    assert validate_argv([launch.argv[2:]])[0]['values']['gradient_accumulation_fusion'] is False


def test_a_dry_run_without_transformer_engine_leaves_no_half_imported_megatron(monkeypatch):
    """The engine-argument check imports Megatron-SWIFT's arguments; without transformer_engine that import fails
    halfway. What it had entered is taken out again: the plugin, registered afterwards in the same process, must not
    take the leftover `swift.megatron` for a `megatron sft` process."""
    import importlib.util
    import sys
    if importlib.util.find_spec('transformer_engine') is not None:
        pytest.skip('transformer_engine is installed here: the import does not fail')
    launch = megatron_launch(monkeypatch, ['apex'], 'extra_args=["--gradient_accumulation_fusion", "true"]')
    assert any('not checked' in n for n in launch.notes)
    assert not [m for m in sys.modules if m.startswith(('swift.megatron', 'mcore_bridge'))]
    from swift_vora import swift_registry
    assert swift_registry.register_megatron_callbacks() is False


def test_the_plugin_does_not_take_a_half_imported_megatron_for_a_megatron_process(monkeypatch):
    import sys
    import types

    from swift_vora import swift_registry
    monkeypatch.setitem(sys.modules, 'swift.megatron', types.ModuleType('swift.megatron'))
    monkeypatch.setitem(sys.modules, 'swift.megatron.callbacks', None)  # its import fails, as without TE
    assert swift_registry.register_megatron_callbacks() is False
