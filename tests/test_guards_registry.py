"""How guards are switched on and off, and how they get into ms-swift's trainer."""
import types

import pytest

from swift_vora.guards.registry import GUARDS, enabled_guards


def test_selection_from_env():
    assert enabled_guards({}) == list(GUARDS)
    assert enabled_guards({'SWIFT_VORA_GUARDS': 'none'}) == []
    assert enabled_guards({'SWIFT_VORA_GUARDS': 'supervision,coverage'}) == ['coverage', 'supervision']
    assert 'memory' not in enabled_guards({'SWIFT_VORA_GUARDS': 'all,-memory'})
    assert enabled_guards({'SWIFT_VORA_GUARDS': 'none', 'SWIFT_VORA_GUARD_MEMORY': '1'}) == ['memory']
    assert 'verify_adapter' not in enabled_guards({'SWIFT_VORA_GUARD_VERIFY_ADAPTER': '0'})
    with pytest.raises(ValueError, match='unknown guard'):
        enabled_guards({'SWIFT_VORA_GUARDS': 'coverag'})
    assert enabled_guards({'SWIFT_VORA_GUARD_MEMORY': ' '}) == list(GUARDS)  # empty: no change
    with pytest.raises(ValueError, match="SWIFT_VORA_GUARD_MEMORY='of': expected one of"):  # a typo is not ignored
        enabled_guards({'SWIFT_VORA_GUARD_MEMORY': 'of'})


def test_registered_in_callbacks_map_and_default_on(monkeypatch):
    import swift  # noqa: F401  (a test dependency: pyproject [test])

    import swift_vora  # noqa: F401 -- the plugin import
    swift_vora.register()
    from swift.callbacks import callbacks_map
    from swift.trainers.mixin import SwiftMixin
    assert {f'vora_{name}' for name in GUARDS} <= set(callbacks_map)
    from swift_vora import patches
    assert patches.patched_by(SwiftMixin._get_callbacks) == 'default_callbacks'

    class FakeTrainer:  # what _get_callbacks needs from a trainer
        pass

    args = types.SimpleNamespace(callbacks=['vora_memory'])
    monkeypatch.delenv('SWIFT_VORA_GUARDS', raising=False)
    monkeypatch.delenv('SWIFT_VORA_LORA_AUTOCAST_INPUTS', raising=False)
    monkeypatch.delenv('SWIFT_VORA_HOST_OVERHEAD', raising=False)
    monkeypatch.delenv('SWIFT_VORA_PIXEL_DTYPE', raising=False)
    names = [type(cb).__name__ for cb in SwiftMixin._get_callbacks(FakeTrainer(), args)]
    # every guard once, plus the speed levers that are on by default and are not guards
    # (swift_vora/speed/lora_autocast.py, swift_vora/speed/host_overhead.py, swift_vora/speed/pixel_dtype.py's check),
    # the trained video budget written into every checkpoint (swift_vora/trained_budget.py, not a switch: a checkpoint
    # must say what it was trained on) and the train-end mark of swift_vora/process_group_exit.py (always)
    assert names.count('MemoryGuard') == 1 and 'CoverageGuard' in names and len(names) == len(GUARDS) + 5
    assert names[-5:] == ['LoraAutocastInputs', 'HostOverhead', 'PixelDtypeCheck', 'RecordBudgetOnSave', 'TrainEnd']
    assert {'vora_lora_autocast', 'vora_host_overhead', 'vora_pixel_dtype'} <= set(callbacks_map)
    monkeypatch.setenv('SWIFT_VORA_GUARDS', 'none')
    monkeypatch.setenv('SWIFT_VORA_LORA_AUTOCAST_INPUTS', '0')
    monkeypatch.setenv('SWIFT_VORA_HOST_OVERHEAD', '0')
    monkeypatch.setenv('SWIFT_VORA_PIXEL_DTYPE', 'float32')
    names = [type(cb).__name__ for cb in SwiftMixin._get_callbacks(FakeTrainer(), args)]
    assert names == ['MemoryGuard', 'RecordBudgetOnSave', 'TrainEnd']  # explicit --callbacks work with the defaults off
    args = types.SimpleNamespace(callbacks=[])
    assert [type(cb).__name__ for cb in SwiftMixin._get_callbacks(FakeTrainer(), args)] == ['RecordBudgetOnSave',
                                                                                          'TrainEnd']
