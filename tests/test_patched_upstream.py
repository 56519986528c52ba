"""The upstream internals swift-vora patches (swift_vora/patches.py) are still there, as our code expects them, and
one the inventory does not know gets the patch's policy when it is applied.

For each patch: the target imports, its parameters are the ones our code calls or overrides, the names our code
relies on are in its source, and for a patch that replaces a body, the original's source is the one its
equivalence test was written against (per tested version). An upgrade that moves or changes a target fails here,
naming the patch and the test to re-run; at run time the same check skips the patch (one warning) or refuses to run,
and fingerprint.json records what was decided."""
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from swift_vora import patches, switches
from swift_vora.patches import PATCHES

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('patch', PATCHES, ids=[p.name for p in PATCHES])
def test_target_matches_the_installed_version(patch):
    """What `patches.applicable` decides when a patch is applied, here for every patch on the installed versions:
    an upgrade that moves or changes a target fails here first, naming the patch and the test to re-run."""
    missing = [m for m in patch.needs if importlib.util.find_spec(m) is None]
    if missing:  # e.g. transformer_engine (CUDA only): the target's source file, read without importing it
        module, qualname = patch.target.split(':')
        spec = importlib.util.find_spec(module.split('.')[0])
        if spec is None and module.split('.')[0] in patch.needs:
            pytest.skip(f'{patch.package} is installed with the GPU machine\'s wheel set only; patches.applicable '
                        f'checks this target there before patching (and tests/test_moe_lora_scale.py checks the '
                        f'pinned source against the wheel where .whl/ holds it)')
        assert spec is not None, f'{patch.name}: {patch.package} is not installed'
        path = Path(spec.submodule_search_locations[0], *module.split('.')[1:]).with_suffix('.py')
        source = path.read_text()
        cls, method = qualname.split('.')
        assert f'class {cls}(' in source and f'def {method}(' in source, f'{patch.name}: {patch.target} not in {path}'
        body = source[source.index(f'class {cls}('):]
        params = re.search(rf'def {method}\((.*?)\):', body, re.S).group(1)
        names = tuple(p.split(':')[0].split('=')[0].strip().lstrip('*') for p in params.split(',')
                      if p.strip() and p.strip() != '*')
        assert names == patch.params, f'{patch.name}: {patch.target} takes {names}'
        unused = [u for u in patch.uses if u not in body]
        assert not unused, f'{patch.name}: {patch.target} no longer uses {unused}'
        return
    why = patches.mismatch(patch)
    assert why is None, (f'{patch.name}: {why} ({patch.package} {patches.installed_version(patch.package)}); re-run '
                         f'{patch.proof}, then record the new version (and source hash) in swift_vora/patches.py')


def test_wrappers_are_looked_through(monkeypatch):
    # the check is against upstream's code even after the plugin patched it in this process
    import swift_vora
    swift_vora.register()
    from swift_vora.speed import vit_attention
    monkeypatch.delenv(vit_attention.ENV, raising=False)
    vit_attention.patch_vision_attention()
    from swift.trainers.mixin import SwiftMixin
    assert patches.patched_by(SwiftMixin._get_callbacks) == 'default_callbacks'
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionAttention
    assert vit_attention.is_patched(Qwen3VLVisionAttention)
    original = patches.resolve('transformers.models.qwen3_vl.modeling_qwen3_vl:Qwen3VLVisionAttention.forward')
    assert original is patches.upstream(Qwen3VLVisionAttention.forward) is not Qwen3VLVisionAttention.forward
    assert patches.resolve('swift.trainers.mixin:SwiftMixin._get_callbacks') is patches.upstream(
        SwiftMixin._get_callbacks)


@pytest.fixture
def unknown_upstream(monkeypatch):
    """A patch of a function whose source is not the one the inventory recorded: a new upstream release."""
    def known_function(x):
        return x

    module = type(sys)('fake_upstream')
    module.known_function = known_function
    monkeypatch.setitem(sys.modules, 'fake_upstream', module)

    def make(policy):
        patch = patches.Patch(f'fake_{policy}', 'fake_upstream:known_function', 'ms-swift', 'replaces', ('x', ),
                              'speed/fake.py', 'SWIFT_VORA_FAKE=off', 'tests/test_fake.py', {'0.0.0': '0' * 16},
                              policy=policy)
        monkeypatch.setitem(patches.BY_NAME, patch.name, patch)
        monkeypatch.setattr(patches, 'PATCHES', (*patches.PATCHES, patch))
        return patch
    yield make
    for policy in patches.POLICIES:
        patches._checked.pop(f'fake_{policy}', None)


def test_an_unknown_upstream_is_skipped_with_one_warning(unknown_upstream, caplog):
    patch = unknown_upstream('skip')
    installed = patches.installed_version('ms-swift')
    with caplog.at_level('WARNING', logger='swift'):
        assert not patches.applicable(patch.name)
        assert not patches.applicable(patch.name)  # decided once: still skipped, no second warning
    warnings = [r.getMessage() for r in caplog.records if patch.name in r.getMessage()]
    assert len(warnings) == 1 and f'ms-swift {installed}' in warnings[0] and 'SWIFT_VORA_FAKE=off' in warnings[0]
    entry = patches.report()[patch.name]
    assert entry['known'] is False and entry['applied'] is False and entry['version'] == installed
    assert 'not a version' in entry['why']


def test_an_unknown_upstream_is_refused_where_the_policy_says_so(unknown_upstream):
    patch = unknown_upstream('refuse')
    with pytest.raises(patches.PatchRefused, match=f'{patch.name}.*SWIFT_VORA_FAKE=off'):
        patches.applicable(patch.name)


def test_a_known_upstream_is_applied_and_recorded():
    name = 'compiled_decoder_layers'  # torch.nn.Module.compile: wraps, importable here
    assert patches.applicable(name)
    patches.mark(lambda: None, name)
    assert patches.report()[name] == {'package': 'torch', 'version': patches.installed_version('torch'),
                                      'known': True, 'policy': 'skip', 'applied': True}


def test_every_patch_site_uses_the_one_marker():
    """No other "already patched" attribute: every replacement is marked with patches.MARKER."""
    import re as regex
    files = list((ROOT / 'swift_vora').rglob('*.py')) + [ROOT / '_swift_vora_hook.py']
    found = {str(p.relative_to(ROOT)): sorted(set(regex.findall(r'_swift_vora_[a-z_]+', p.read_text())))
             for p in files}
    # data kept on objects, not markers: the guards' tap, the vision attention's split sizes cache
    allowed = {'_swift_vora_patch', '_swift_vora_tap', '_swift_vora_split_sizes', '_swift_vora_hook'}
    assert {path: names for path, names in found.items() if set(names) - allowed} == {}


def test_inventory_is_complete_and_usable():
    names = [p.name for p in PATCHES]
    assert len(names) == len(set(names))
    for patch in PATCHES:
        assert patch.kind in ('wraps', 'replaces', 'sets') and patch.policy in patches.POLICIES
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


def test_a_target_whose_needs_are_missing_is_not_imported_halfway(tmp_path, monkeypatch):
    """A patch whose target module needs what this machine lacks (transformer_engine for `swift.megatron` on a CPU or
    an Unsloth machine) is reported unknown without importing it: a failed import left `swift.megatron` half-imported
    in sys.modules, which the plugin then read as "inside megatron sft" -- the Unsloth runner stopped building its
    template (its fingerprint checks every patch first)."""
    pkg = tmp_path / 'vora_half_pkg'
    (pkg / 'sub').mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    (pkg / 'sub' / '__init__.py').write_text('import vora_module_not_installed\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    patch = patches.Patch('half', 'vora_half_pkg.sub:f', 'nothing', 'wraps', (), 'nowhere', 'off', 'none',
                          needs=('vora_module_not_installed', ))
    assert patches.mismatch(patch) == 'vora_half_pkg.sub:f needs vora_module_not_installed, which is not installed'
    assert 'vora_half_pkg' not in sys.modules
