"""The one table of speed levers (swift_vora/speed/__init__.py) says what the modules do: the switch each module
reads, the callback it registers, and the plugin wiring appends exactly the callback levers that are on."""
import types

import pytest

from swift_vora import speed


def test_table_matches_the_modules():
    assert {lever.name for lever in speed.LEVERS} == {
        'compile_layers', 'vit_attention', 'lora_autocast', 'host_overhead', 'shape_bucket', 'pixel_dtype',
        'video_decode', 'selective_checkpoint', 'packed_attention', 'patch_embed', 'fp8_frozen', 'partial_checkpoint',
        'moe_lora_scale'}
    for lever in speed.LEVERS:
        assert lever.module.ENV == lever.switch, lever.name
        if lever.callback:
            assert callable(getattr(lever.module, 'enabled')), lever.name
            assert speed.callback_class(lever).__name__ == lever.callback


@pytest.mark.parametrize('env, on', [
    ({}, ['lora_autocast', 'host_overhead', 'pixel_dtype']),
    ({'SWIFT_VORA_COMPILE': 'layers', 'SWIFT_VORA_HOST_OVERHEAD': '0'},
     ['lora_autocast', 'compile_layers', 'pixel_dtype']),
    ({'SWIFT_VORA_PIXEL_DTYPE': 'float32', 'SWIFT_VORA_LORA_AUTOCAST_INPUTS': 'off'}, ['host_overhead']),
    ({'SWIFT_VORA_SELECTIVE_CHECKPOINT': 'attention'},
     ['lora_autocast', 'host_overhead', 'selective_checkpoint', 'pixel_dtype']),
    # FP8 swaps modules before host_overhead remembers them and compile_layers compiles them
    ({'SWIFT_VORA_FP8': 'frozen_base', 'SWIFT_VORA_COMPILE': 'layers'},
     ['lora_autocast', 'fp8_frozen', 'host_overhead', 'compile_layers', 'pixel_dtype']),
    # fewer checkpointed layers before compile_layers / selective_checkpoint, which act on the checkpointed ones
    ({'SWIFT_VORA_CHECKPOINT_LAYERS': '20', 'SWIFT_VORA_COMPILE': 'layers',
      'SWIFT_VORA_SELECTIVE_CHECKPOINT': 'matmul'},
     ['lora_autocast', 'host_overhead', 'partial_checkpoint', 'compile_layers', 'selective_checkpoint',
      'pixel_dtype']),
])
def test_defaults_and_switches_of_the_callback_levers(env, on):
    assert [lever.name for lever in speed.callback_levers() if lever.enabled(env)] == on


def test_plugin_appends_lever_callbacks_after_guards(monkeypatch):
    import swift_vora
    swift_vora.register()
    from swift.trainers.mixin import SwiftMixin
    for variable in ('SWIFT_VORA_LORA_AUTOCAST_INPUTS', 'SWIFT_VORA_HOST_OVERHEAD', 'SWIFT_VORA_PIXEL_DTYPE'):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv('SWIFT_VORA_GUARDS', 'none')
    monkeypatch.setenv('SWIFT_VORA_COMPILE', 'layers')
    monkeypatch.setenv('SWIFT_VORA_SELECTIVE_CHECKPOINT', 'matmul')
    monkeypatch.setenv('SWIFT_VORA_FP8', 'frozen_base')
    monkeypatch.setenv('SWIFT_VORA_CHECKPOINT_LAYERS', '20')

    class FakeTrainer:
        pass

    names = [type(cb).__name__ for cb in SwiftMixin._get_callbacks(FakeTrainer(), types.SimpleNamespace(callbacks=[]))]
    # + the trained budget's recorder (swift_vora/trained_budget.py) and process_group_exit's
    assert names == [lever.callback for lever in speed.callback_levers()] + ['RecordBudgetOnSave', 'TrainEnd']


def test_lever_defaults_come_from_the_switch_table():
    from swift_vora import switches
    for lever in speed.LEVERS:
        assert lever.default.startswith(repr(switches.table()[lever.switch].default)), lever.name
