"""Unsloth's fused MoE router under the runner (swift_vora/speed/moe_router.py, Unsloth's switch
UNSLOTH_MOE_FUSED_ROUTER=1). What a user relies on: with the switch off nothing of unsloth_zoo's router is touched;
with it on, the loaded model's router classes are handed to unsloth_zoo's loader hook and the record says which of
them still route as before, and how many routing calls went fused. unsloth_zoo imports only on a GPU machine here: a
stand-in module plays its hook; where .whl/moe has the wheel, its real module is read (never imported) to check that
it still offers what the runner calls and recognises the router of the installed transformers."""
import os
import sys
import types
import zipfile

import moe_wheels
import pytest
import torch
import unsloth_compiled

from swift_vora.speed import moe_router

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS = [w for w in [moe_wheels.wheel('unsloth_zoo')] if w]  # .whl/moe, else .fetched/wheels


@pytest.fixture(scope='module')
def tiny_moe():
    from transformers import Qwen3_5MoeForConditionalGeneration

    from swift_vora.tiny_model import qwen3_5_moe_config
    torch.manual_seed(0)
    return Qwen3_5MoeForConditionalGeneration(qwen3_5_moe_config('tiny', None))


def stand_in(monkeypatch, recognise: bool):
    """unsloth_zoo's router module as the runner uses it: a loader hook that marks the forward of the classes it
    recognises (here: all or none) and a count of fused calls."""
    module = types.ModuleType(moe_router.MODULE)
    module.ROUTER_CALLS = {'fused': 0}
    patched = []

    def enable_fused_router(model):
        done = []
        for m in model.modules():
            cls = type(m)
            if recognise and cls.__name__.endswith('TopKRouter') and cls not in patched:
                original = cls.__dict__['forward']

                def forward(self, hidden_states, _original=original):
                    module.ROUTER_CALLS['fused'] += 1
                    return _original(self, hidden_states)
                forward._unsloth_fused_router = True
                monkeypatch.setattr(cls, 'forward', forward)
                patched.append(cls)
                done.append(cls.__name__)
        return done

    module.enable_fused_router = enable_fused_router
    monkeypatch.setitem(sys.modules, moe_router.MODULE, module)
    return module


def test_switch_off_touches_nothing(tiny_moe, monkeypatch):
    module = stand_in(monkeypatch, recognise=True)
    module.enable_fused_router = lambda model: pytest.fail('the hook ran with the switch off')
    for value in (None, '0', 'true', ''):  # unsloth_zoo's own reading: exactly '1' is on
        env = {} if value is None else {moe_router.ENV: value}
        assert not moe_router.wanted(env)
        assert moe_router.install(tiny_moe, env) == {'setting': env.get(moe_router.ENV, '0')}


def test_switch_on_hands_the_models_router_classes_to_the_hook_and_counts_fused_calls(tiny_moe, monkeypatch):
    stand_in(monkeypatch, recognise=True)
    state = moe_router.install(tiny_moe, {moe_router.ENV: '1'})
    assert state['patched_now'] == ['Qwen3_5MoeTopKRouter']
    assert state['router_classes'] == ['transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeTopKRouter']
    assert state['unfused'] == []
    layers = tiny_moe.config.text_config.num_hidden_layers
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        tiny_moe.model.language_model(input_ids=ids)
    assert moe_router.fused_calls() == layers  # one routing call per MoE layer


def test_a_router_the_hook_does_not_recognise_is_reported_unfused(tiny_moe, monkeypatch):
    stand_in(monkeypatch, recognise=False)
    state = moe_router.install(tiny_moe, {moe_router.ENV: '1'})
    assert state['patched_now'] == [] and state['unfused'] == state['router_classes'] != []
    (name, why), = state['why_unfused'].items()
    assert name == state['unfused'][0]
    # the forward in the class is transformers' own, from its modeling file; a stand-in without unsloth_zoo's
    # reader says so instead of guessing
    assert why['forward'].endswith('Qwen3_5MoeTopKRouter.forward')
    assert why['defined_at'].split(':')[0].endswith(os.path.join('qwen3_5_moe', 'modeling_qwen3_5_moe.py'))
    assert why['_body_lines'] == why['_router_form'] == 'not in this unsloth_zoo'


def test_why_unfused_names_a_forward_that_replaced_the_routers_and_what_unsloth_zoo_read_of_it(tiny_moe,
                                                                                                 monkeypatch):
    """Calls p and r: the class unfused, its forward not the one unsloth_zoo knows. The record names the forward
    in the class (module, name, file and line), the body lines unsloth_zoo compared and its verdict."""
    module = stand_in(monkeypatch, recognise=False)
    read = []
    module._body_lines = lambda fn: read.append(fn) or ('return wrapped(self, hidden_states)',)
    module._router_form = lambda cls: None
    cls = type(tiny_moe.model.language_model.layers[0].mlp.gate)

    def replacement(self, hidden_states):
        return original(self, hidden_states)
    original = cls.__dict__['forward']
    monkeypatch.setattr(cls, 'forward', replacement)
    why = moe_router.install(tiny_moe, {moe_router.ENV: '1'})['why_unfused'][f'{cls.__module__}.{cls.__name__}']
    assert read == [replacement]
    assert why == {'forward': f'{__name__}.{replacement.__qualname__}',
                   'defined_at': f'{__file__}:{replacement.__code__.co_firstlineno}',
                   'body': ['return wrapped(self, hidden_states)'], 'form': None}


def test_an_unsloth_zoo_without_the_fused_router_is_said_not_raised(tiny_moe, monkeypatch):
    monkeypatch.setitem(sys.modules, moe_router.MODULE, None)  # import raises ImportError
    state = moe_router.install(tiny_moe, {moe_router.ENV: '1'})
    assert state['setting'] == '1' and moe_router.MODULE in state['not_installed']
    assert moe_router.fused_calls() is None


def real_router_module(tmp_path):
    """unsloth_zoo's router module as the wheel has it, run with its one package import stood in (it imports nothing
    else of unsloth_zoo): a package of its own in tmp_path (Triton reads a kernel's source from its file), beside a
    `common` that holds the one name it imports. Returns (module, its source)."""
    with zipfile.ZipFile(WHEELS[-1]) as z:
        source = z.read('unsloth_zoo/temporary_patches/moe_router_triton.py').decode()
    package = tmp_path / 'uz_stand_in'
    package.mkdir(parents=True)
    (package / '__init__.py').write_text('')
    (package / 'common.py').write_text('TEMPORARY_PATCHES = []\n')
    (package / 'moe_router_triton.py').write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib
        module = importlib.import_module('uz_stand_in.moe_router_triton')
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == 'uz_stand_in' or n.startswith('uz_stand_in.')]:
            del sys.modules[name]
    return module, source


@pytest.mark.skipif(not WHEELS, reason=moe_wheels.MISSING)
def test_the_real_module_offers_the_hook_and_recognises_this_transformers_router(tmp_path):
    """unsloth_zoo's module, read from the wheel and run with its one package import stood in (it imports nothing
    else of unsloth_zoo): the names the runner uses, the switch read as the runner reads it, and the installed
    transformers' Qwen3.5-MoE router recognised -- a reworded router upstream would leave the lever silently off."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
    module, source = real_router_module(tmp_path)
    assert callable(module.enable_fused_router) and module.ROUTER_CALLS == {'fused': 0}
    assert f'"{moe_router.ENV}", "0") == "1"' in source
    assert ('qwen3_5_moe', 'Qwen3_5MoeTopKRouter') in module._ROUTER_CLASSES
    form = module._router_form(modeling_qwen3_5_moe.Qwen3_5MoeTopKRouter)
    assert form is not None and form.startswith('softmax'), form
    # the record's reading through the real reader: transformers' forward, the body unsloth_zoo compares, its form
    why = moe_router.why_unfused(module, modeling_qwen3_5_moe.Qwen3_5MoeTopKRouter)
    assert why['form'] == form and why['body'][0] == 'hidden_states = hidden_states.reshape(-1, self.hidden_dim)'
    assert why['defined_at'].startswith(modeling_qwen3_5_moe.__file__ + ':')
    # its eager reference routes as transformers' router does (the Triton kernels keep "the same set")
    router = modeling_qwen3_5_moe.Qwen3_5MoeTopKRouter(
        __import__('swift_vora.tiny_model', fromlist=['x']).qwen3_5_moe_config('tiny', None).text_config)
    torch.nn.init.normal_(router.weight)
    hidden = torch.randn(64, router.hidden_dim)
    logits, scores, ids = router(hidden)
    w, ref_ids = module.moe_router_reference(logits, router.top_k, 'softmax_topk', True)
    assert torch.equal(ids, ref_ids) and torch.allclose(scores, w.to(scores.dtype))


@pytest.mark.skipif(not unsloth_compiled.WHEELS, reason=unsloth_compiled.MISSING)
def test_the_router_class_unsloths_compiler_generates_is_read_and_routes_fused(tmp_path, monkeypatch):
    """Calls p and r's unfused router, reproduced: Unsloth's compiler (from the wheel, on this transformers) generates
    the router class with a compiled copy of its forward, in a module that claims transformers' modeling module as
    its own; unsloth_zoo's reader looks the copy up there and finds nothing. With the switch on, the runner's lookup
    reads the copy through the class forward's own globals: unsloth_zoo's hook then installs its fused forward, which
    off CUDA falls back to the class's own -- the same routing."""
    from transformers import Qwen3_5MoeForConditionalGeneration
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

    from swift_vora import patches
    from swift_vora.tiny_model import qwen3_5_moe_config
    module, _ = real_router_module(tmp_path / 'router')
    monkeypatch.setitem(sys.modules, moe_router.MODULE, module)
    # the package it belongs to, as imported in the runner (the patch needs unsloth_zoo: here the router module alone)
    monkeypatch.setitem(sys.modules, 'unsloth_zoo', sys.modules.get('unsloth_zoo') or types.ModuleType('unsloth_zoo'))
    monkeypatch.delitem(patches._checked, moe_router.PATCH, raising=False)  # decided per process: here, for this
    monkeypatch.setenv(moe_router.ENV, '1')  # unsloth_zoo reads its switch from the environment at each call
    compiled = unsloth_compiled.compiled_module(tmp_path, 'unsloth_compiled_router', ('Qwen3_5MoeTopKRouter', False))
    cls = compiled.Qwen3_5MoeTopKRouter
    assert cls.__module__ == modeling_qwen3_5_moe.__name__  # as in the GPU record
    assert module._router_form(cls) is None  # upstream's reading of it, unchanged: what left calls p and r unfused

    torch.manual_seed(0)
    model = Qwen3_5MoeForConditionalGeneration(qwen3_5_moe_config('tiny', None)).eval()
    gates = [m for m in model.modules() if type(m).__name__ == 'Qwen3_5MoeTopKRouter']
    for gate in gates:
        gate.__class__ = cls
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        expected = model.model.language_model(input_ids=ids).last_hidden_state
    state = moe_router.install(model, {moe_router.ENV: '1'})
    assert state['compiled_copy_lookup'] == 'installed'
    assert state['patched_now'] == ['Qwen3_5MoeTopKRouter'] and state['unfused'] == []
    assert getattr(cls.__dict__['forward'], '_unsloth_fused_router', False)
    assert module._SUPPORTED[f'{cls.__module__}.{cls.__name__}'] == 'softmax_true_cast'
    with torch.no_grad():
        got = model.model.language_model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert moe_router.fused_calls() == 0  # off CUDA unsloth_zoo routes through the class's own forward
