"""backends/megatron_fla.py: which flash-linear-attention the Gated DeltaNet layers bind under `megatron sft`.

On CPU: the decision for every machine (Hopper with a bad Triton, fixed Triton, no GPU; vendored fla present or
not), that the vendored tree is found without running unsloth_zoo's __init__, that installing it rebinds exactly
the globals the inventory names (fake vendored tree, fake GatedDeltaNet modules), that nothing happens unless the
launch asked, that the launch asks only for models with linear-attention layers, and the gradient check (PyTorch
reference on both sides passes; a kernel off by a few percent in one gradient fails). The real kernels run on the
GPU (scripts/gpu/gdn_grad_check.py)."""
import os
import sys
import types

import pytest

from swift_vora import patches
from swift_vora.backends import megatron_fla as mf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
VENDORED = '/site/unsloth_zoo/_vendored/fla'


@pytest.mark.parametrize('mode,hopper,triton,vendored,upstream,action', [
    ('off', True, '3.6.0', VENDORED, True, 'none'),
    ('auto', True, '3.6.0', VENDORED, True, 'vendored'),  # the H200 image: upstream fla is wrong there
    ('auto', True, '3.6.0', VENDORED, False, 'vendored'),
    ('auto', True, '3.4.0', None, True, 'refuse'),  # no correct kernel: refuse rather than train on wrong gradients
    ('auto', True, '3.6.0', None, False, 'refuse'),
    ('auto', True, '3.7.1', None, True, 'upstream'),  # fixed Triton: upstream fla is correct
    ('auto', True, '3.3.1', VENDORED, True, 'upstream'),  # before the miscompile
    ('auto', False, '3.6.0', VENDORED, True, 'upstream'),  # not Hopper
    ('auto', None, None, VENDORED, True, 'upstream'),  # no GPU
    ('auto', False, '3.6.0', VENDORED, False, 'vendored'),  # nothing else to bind
    ('auto', False, '3.6.0', None, False, 'none'),  # megatron-core will say "FLA is not installed" itself
    ('vendored', False, '3.7.1', VENDORED, True, 'vendored'),
    ('vendored', False, '3.7.1', None, True, 'refuse'),
])
def test_decision(mode, hopper, triton, vendored, upstream, action):
    decision = mf.decide(mode, hopper, triton, vendored, upstream)
    assert decision.action == action, decision.why
    if action == 'refuse':
        assert 'unsloth_zoo' in decision.why and mf.ENV in decision.why


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match=mf.ENV):
        mf.decide('maybe', True, '3.6.0', VENDORED, True)


def _vendored_tree(root, hopper_fix=True):
    """A stand-in for unsloth_zoo/_vendored/fla: the three modules mcore-bridge and megatron-core take from fla."""
    pkg = root / 'unsloth_zoo'
    fla = pkg / '_vendored' / 'fla'
    for sub in ('modules', 'ops', 'ops/gated_delta_rule', 'ops/common', 'utils'):
        (fla / sub).mkdir(parents=True, exist_ok=True)
        (fla / sub / '__init__.py').write_text('')
    # executing unsloth_zoo's __init__ would apply Unsloth's patches: the lookup must not run it
    (pkg / '__init__.py').write_text('raise RuntimeError("unsloth_zoo/__init__.py must not run")\n')
    (fla / '__init__.py').write_text('__version__ = "0.5.1"\n')
    # as the real tree's fla/utils/_decorators.py does: its version read through unsloth_zoo's package path
    (fla / 'utils' / '__init__.py').write_text('from unsloth_zoo._vendored.fla import __version__\n')
    (fla / 'modules' / 'l2norm.py').write_text(
        'import fla.utils\n\ndef l2norm(x):\n    return ("vendored l2norm", x)\n')
    (fla / 'ops' / 'gated_delta_rule' / '__init__.py').write_text(
        'from fla.ops.common.chunk_o import kernel as chunk_gated_delta_rule\n')
    (fla / 'ops' / 'common' / 'chunk_o.py').write_text(
        ('def _is_hopper_tensor(x):\n    return True\n' if hopper_fix else '')
        + 'def kernel(*a, **k):\n    return "vendored"\n')
    return str(fla)


@pytest.fixture
def clean_fla(monkeypatch):
    """sys.modules without any fla, restored afterwards; the inventory's two patches decided as known."""
    for name in [n for n in sys.modules if n == 'fla' or n.startswith(('fla.', 'unsloth_zoo'))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(patches._checked, 'megatron_gdn_fla', None)
    monkeypatch.setitem(patches._checked, 'mcore_bridge_gdn_fla', None)
    monkeypatch.setattr(mf, '_last', None)
    monkeypatch.delenv('FLA_TILELANG', raising=False)
    monkeypatch.delenv('FLA_INTRACARD_CP', raising=False)
    yield
    for name in [n for n in sys.modules if n == 'fla' or n.startswith(('fla.', 'unsloth_zoo'))]:
        sys.modules.pop(name, None)


def test_vendored_tree_is_found_without_running_unsloth_zoo(tmp_path, monkeypatch):
    path = _vendored_tree(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'unsloth_zoo', raising=False)
    assert mf.vendored_fla_dir() == os.path.join(str(tmp_path / 'unsloth_zoo'), '_vendored', 'fla') == path
    assert 'unsloth_zoo' not in sys.modules


def test_a_vendored_tree_without_the_hopper_fix_is_not_used(tmp_path, monkeypatch):
    _vendored_tree(tmp_path, hopper_fix=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'unsloth_zoo', raising=False)
    assert mf.vendored_fla_dir() is None


def _targets():
    return {name: types.SimpleNamespace(l2norm=None, chunk_gated_delta_rule=None, causal_conv1d=None,
                                        **({'HAVE_FLA': False} if name == mf.MEGATRON_GDN else {}))
            for name in mf.BINDINGS}


def test_install_binds_the_vendored_kernels(tmp_path, clean_fla):
    path = _vendored_tree(tmp_path)
    modules = _targets()
    logged = []
    decision = mf.install('auto', device=(True, '3.6.0'), vendored=path, upstream=False, modules=modules,
                          log=logged.append)
    assert decision.action == 'vendored'
    assert mf.bound_fla_dir() == os.path.abspath(path)
    assert 'unsloth_zoo' not in sys.modules and sys.modules[mf.VENDOR_ALIAS] is sys.modules['fla']
    for module in modules.values():
        assert module.l2norm(1) == ('vendored l2norm', 1) and module.chunk_gated_delta_rule() == 'vendored'
        assert module.causal_conv1d is None  # left as imported: mcore-bridge's exact F.conv1d path
    assert modules[mf.MEGATRON_GDN].HAVE_FLA is True and not hasattr(modules[mf.MCORE_BRIDGE_GDN], 'HAVE_FLA')
    expected = [f'{m}.{a}' for m in mf.BINDINGS for a in ('l2norm', 'chunk_gated_delta_rule')]
    assert sorted(decision.rebound) == sorted(expected + [f'{mf.MEGATRON_GDN}.HAVE_FLA'])
    assert patches.report()['megatron_gdn_fla']['applied'] and patches.report()['mcore_bridge_gdn_fla']['applied']
    assert os.environ['FLA_TILELANG'] == '0' and 'vendored' in logged[0]
    assert mf.last_decision()['action'] == 'vendored'


def test_an_upstream_the_inventory_does_not_know_is_left_alone(tmp_path, clean_fla, monkeypatch):
    monkeypatch.setitem(patches._checked, 'mcore_bridge_gdn_fla', 'forward takes other parameters')
    modules = _targets()
    decision = mf.install('auto', device=(True, '3.6.0'), vendored=_vendored_tree(tmp_path), upstream=False,
                          modules=modules, log=lambda _: None)
    assert modules[mf.MCORE_BRIDGE_GDN].l2norm is None  # policy skip: upstream's bindings stand
    assert modules[mf.MEGATRON_GDN].l2norm is not None
    assert all(r.startswith(mf.MEGATRON_GDN) for r in decision.rebound)


def test_refusal_raises_before_anything_is_bound(clean_fla):
    modules = _targets()
    with pytest.raises(RuntimeError, match='fla #640'):
        mf.install('auto', device=(True, '3.6.0'), vendored=None, upstream=True, modules=modules, log=lambda _: None)
    assert 'fla' not in sys.modules and modules[mf.MEGATRON_GDN].l2norm is None
    assert mf.last_decision()['action'] == 'refuse'


def test_nothing_happens_unless_the_launch_asked(monkeypatch, clean_fla):
    def boom(*a, **k):
        raise AssertionError('install must not run')
    monkeypatch.setattr(mf, 'install', boom)
    assert mf.install_from_env({}) is None
    assert mf.install_from_env({mf.ENV: 'off'}) is None
    assert mf.install_from_env({mf.ENV: '0'}) is None


def test_decided_once_per_process(monkeypatch, clean_fla):
    calls = []
    monkeypatch.setattr(mf, '_last', None)
    monkeypatch.setattr(mf, 'install', lambda mode: calls.append(mode) or mf.decide(mode, None, None, None, False))
    first = mf.install_from_env({mf.ENV: 'auto'})
    monkeypatch.setattr(mf, '_last', first)  # what install() records
    assert mf.install_from_env({mf.ENV: 'auto'}) is first and calls == ['auto']


def test_the_switch_refuses_a_bad_value():
    from swift_vora import switches
    with pytest.raises(switches.SwitchError):
        switches.read(mf.ENV, {mf.ENV: 'maybe'})


def _megatron_launch(model, model_type, environ=None):
    from megatron_args import H200X8_AS_MEGATRON_LORA

    from swift_vora.backends.launch import build_launch
    from swift_vora.backends.planning import plan_recipe
    from swift_vora.backends.recipe import load_recipe
    recipe = load_recipe(os.path.join(REPO, 'recipes', 'h200x8.yaml'),
                         [f'model.path={os.path.join(CONFIGS, model)}', f'model.type={model_type}',
                          *H200X8_AS_MEGATRON_LORA])
    return build_launch(plan_recipe(recipe), recipe, environ=environ or {})


def test_the_launch_asks_for_gated_deltanet_models_only():
    launch = _megatron_launch('qwen3_5_moe_35b_a3b.json', 'qwen3_5_moe')
    assert launch.env[mf.ENV] == 'auto' and any('Gated DeltaNet' in n for n in launch.notes)
    assert mf.ENV not in _megatron_launch('qwen3_vl_moe_30b_a3b.json', 'qwen3_vl_moe').env
    # the user's own setting wins
    assert mf.ENV not in _megatron_launch('qwen3_5_moe_35b_a3b.json', 'qwen3_5_moe', {mf.ENV: 'off'}).env


def _reference():
    pytest.importorskip('megatron.core', reason='megatron-core comes with the test extras (pip install -e .[test])')
    from megatron.core.ssm.gated_delta_net import torch_chunk_gated_delta_rule
    return torch_chunk_gated_delta_rule


def test_gradient_check_passes_the_reference_and_catches_a_wrong_gradient():
    import torch
    ref = _reference()
    small = dict(seq=128, heads=2, head_dim=32)
    same = mf.gradient_check(ref, mf.reference_l2norm, ref, **small)
    assert same['ok'] and max(same['rel_error'].values()) < 1e-5, same

    class OffGrad(torch.autograd.Function):  # identity forward, beta's gradient 5 % off (what fla #640 did to db)
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * 1.05

    def wrong(q, k, v, g, beta, **kw):
        return ref(q, k, v, g=g, beta=OffGrad.apply(beta), **kw)

    bad = mf.gradient_check(wrong, mf.reference_l2norm, ref, **small)
    assert not bad['ok'] and bad['rel_error']['dbeta'] > 0.02 and bad['rel_error']['out'] < 1e-5, bad
