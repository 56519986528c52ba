"""The upstream internals swift-vora patches (swift_vora/patches.py) are still there, as our code expects them.

For each patch: the target imports, its parameters are the ones our code calls or overrides, the names our code
relies on are in its source, and for a patch that replaces a body, the original's source is the one its
equivalence test was written against (per tested version). An upgrade that moves or changes a target fails here,
naming the patch and the test to re-run, instead of silently diverging."""
import hashlib
import importlib
import inspect
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from swift_vora import switches
from swift_vora.patches import PATCHES

ROOT = Path(__file__).resolve().parents[1]


def resolve(target):
    """The upstream object, as shipped: swift-vora's own wrappers (installed by other tests) are looked through."""
    module, qualname = target.split(':')
    obj = importlib.import_module(module)
    for part in qualname.split('.'):
        obj = getattr(obj, part)
        while getattr(obj, '_swift_vora_original', None) is not None or hasattr(obj, '__wrapped__'):
            obj = getattr(obj, '_swift_vora_original', None) or obj.__wrapped__
    return obj


@pytest.mark.parametrize('patch', PATCHES, ids=[p.name for p in PATCHES])
def test_target_matches_the_installed_version(patch):
    installed = version(patch.package)
    try:
        target = resolve(patch.target)
    except (ImportError, AttributeError) as e:
        pytest.fail(f'{patch.name}: {patch.target} is gone in {patch.package} {installed} ({e}); '
                    f'{patch.where} must follow it')
    params = tuple(inspect.signature(target).parameters)
    assert params == patch.params, (f'{patch.name}: {patch.target} in {patch.package} {installed} takes {params}, '
                                    f'{patch.where} was written for {patch.params}')
    source = inspect.getsource(target)
    for name in patch.uses:
        assert name in source, f'{patch.name}: {patch.target} no longer uses {name!r} ({patch.package} {installed})'
    if patch.kind == 'replaces':
        assert installed in patch.sources, (
            f'{patch.name}: {patch.package} {installed} is not a version {patch.where} was checked against '
            f'({", ".join(patch.sources)}): run {patch.proof}, then record the source hash in swift_vora/patches.py')
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        assert digest == patch.sources[installed], (
            f'{patch.name}: the source of {patch.target} changed in {patch.package} {installed}; '
            f'{patch.where} replaces it -- re-check it with {patch.proof}')


def test_wrappers_are_looked_through(monkeypatch):
    # the check is against upstream's code even after the plugin patched it in this process
    import swift_vora
    swift_vora.register()
    from swift_vora.speed import vit_attention
    monkeypatch.delenv(vit_attention.ENV, raising=False)
    vit_attention.patch_vision_attention()
    from swift.trainers.mixin import SwiftMixin
    assert getattr(SwiftMixin._get_callbacks, '_swift_vora_guards', False)
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionAttention
    assert vit_attention.is_patched(Qwen3VLVisionAttention)
    original = resolve('transformers.models.qwen3_vl.modeling_qwen3_vl:Qwen3VLVisionAttention.forward')
    assert original is Qwen3VLVisionAttention.forward._swift_vora_original
    assert resolve('swift.trainers.mixin:SwiftMixin._get_callbacks') is SwiftMixin._get_callbacks.__wrapped__


def test_inventory_is_complete_and_usable():
    names = [p.name for p in PATCHES]
    assert len(names) == len(set(names))
    for patch in PATCHES:
        assert patch.kind in ('wraps', 'replaces', 'sets')
        assert (ROOT / 'swift_vora' / patch.where).is_file() or (ROOT / patch.where).is_file(), patch.where
        assert (ROOT / patch.proof).is_file(), patch.proof
        for variable in re.findall(r'SWIFT_VORA_[A-Z0-9_]+', patch.off):  # the off switch exists as written
            assert variable in switches.table(), (patch.name, variable)
        assert (patch.kind == 'replaces') == bool(patch.sources), patch.name
    doc = (ROOT / 'docs' / 'upstream-patches.md').read_text()
    assert all(f'`{p.name}`' in doc for p in PATCHES)


def test_lever_modules_patch_the_classes_the_inventory_lists():
    # the inventory is the one list: vit_attention and patch_embed install on the targets it names
    from swift_vora.patches import forward_targets
    from swift_vora.speed import patch_embed, vit_attention
    assert [c for _, c in vit_attention.CLASSES] == ['Qwen3VLVisionAttention', 'Qwen3VLMoeVisionAttention',
                                                     'Qwen3_5VisionAttention', 'Qwen3_5MoeVisionAttention']
    assert [c for _, c in patch_embed.CLASSES] == ['PatchEmbed', 'Qwen2_5_VisionPatchEmbed', 'Qwen3VLVisionPatchEmbed',
                                                   'Qwen3VLMoeVisionPatchEmbed', 'Qwen3_5VisionPatchEmbed',
                                                   'Qwen3_5MoeVisionPatchEmbed']
    assert forward_targets('patch_embed_') == [*patch_embed.CLASSES, ('torch.nn', 'Conv3d')]  # + the per-instance one
