"""SWIFT_VORA_GDN_QK_HEADS=grouped (swift_vora/speed/gdn_qk_heads.py): Gated DeltaNet's query and key reach the chunk
kernel at their own head count where that kernel is flash-linear-attention's. What a user relies on: the same outputs
and gradients as transformers' repeat; nothing changes where the kernel is transformers' PyTorch reference (a CPU, no
fla) or on a one-token decode step; Unsloth's generated copy of the forward is taken only when its statements are
transformers'; a kernel that refuses grouped heads keeps the forward, and the record says why.

fla's Triton kernel needs a GPU: here a stand-in with fla's contract (a function `chunk_gated_delta_rule` of module
`fla.ops.gated_delta_rule.chunk`, value head h reading key head h // (HV // H)) computes through transformers' own
PyTorch reference, bound the way transformers' hub wrapper binds fla (a closure cell). The GPU test at the end runs
the real kernel."""
import functools
import inspect
import os
import textwrap

import pytest
import torch
import unsloth_compiled
from transformers import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as M

from swift_vora import patches
from swift_vora.speed import gdn_qk_heads as G

ON = {G.ENV: 'grouped'}
REFERENCE = M.torch_chunk_gated_delta_rule  # transformers' hub wrapper around its PyTorch reference (no fla here)


def fake_fla(seen, refuse_groups=False):
    """fla's chunk_gated_delta_rule contract on the CPU, behind a wrapper shaped like transformers' hub wrapper."""
    def chunk_gated_delta_rule(q, k, v, g, beta, **kwargs):
        heads, value_heads = q.shape[2], v.shape[2]
        seen.append(heads)
        if value_heads != heads:
            if refuse_groups:  # an fla without grouped value heads
                raise ValueError(f'q has {heads} heads, v {value_heads}')
            q = q.repeat_interleave(value_heads // heads, dim=2)
            k = k.repeat_interleave(value_heads // heads, dim=2)
        return inspect.unwrap(REFERENCE)(q, k, v, g, beta, **kwargs)

    chunk_gated_delta_rule.__module__ = 'fla.ops.gated_delta_rule.chunk'
    implementation = chunk_gated_delta_rule

    @functools.wraps(inspect.unwrap(REFERENCE))
    def wrapped(*args, **kwargs):
        return implementation(*args, **kwargs)

    return wrapped


def unsloth_disabled(fn):
    """Shaped like unsloth_zoo's `torch_compiler_disable_unless_decode`: functools.wraps around a disabled call."""
    @functools.wraps(fn)
    def forward(*args, **kwargs):
        return fn(*args, **kwargs)
    forward._unsloth_undisabled = fn
    return forward


def gdn_layer(seed=0):
    config = Qwen3_5MoeTextConfig(hidden_size=32, num_hidden_layers=1, layer_types=['linear_attention'],
                                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                  linear_value_head_dim=8, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                  shared_expert_intermediate_size=16)
    torch.manual_seed(seed)
    layer = M.Qwen3_5MoeGatedDeltaNet(config, layer_idx=0).float()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.3)
    return torch.nn.ModuleDict({'linear_attn': layer})  # what install() walks: a model's modules


def forward_and_grads(model, seed=1, length=80):
    """Output and gradients (input, in_proj_qkv) of one call on a sequence longer than one 64-token chunk."""
    layer = model['linear_attn']
    torch.manual_seed(seed)
    x = torch.randn(2, length, 32, requires_grad=True)
    layer.zero_grad(set_to_none=True)
    out = layer(x)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), x.grad.detach(), layer.in_proj_qkv.weight.grad.detach()


@pytest.fixture
def restore():
    """transformers' class forward and module kernel global as they were, whatever the test installed."""
    forward, kernel = M.Qwen3_5MoeGatedDeltaNet.forward, M.torch_chunk_gated_delta_rule
    yield
    M.Qwen3_5MoeGatedDeltaNet.forward, M.torch_chunk_gated_delta_rule = forward, kernel


def test_grouped_heads_give_the_repeats_outputs_and_gradients(restore):
    seen = []
    M.torch_chunk_gated_delta_rule = fake_fla(seen)
    model = gdn_layer()
    expected = forward_and_grads(model)
    assert seen == [4]  # transformers repeats 2 key heads to the 4 value heads

    before = G.CALLS['grouped']
    state = G.install(model, ON)
    assert G.CALLS['grouped'] == before  # installing calls nothing
    entry = state['classes']['Qwen3_5MoeGatedDeltaNet']
    assert entry['state'] == 'installed, waiting for its first call'
    assert entry['what'] == 'class' and entry['kernel'] == 'fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule'
    seen.clear()
    first = forward_and_grads(model)  # the check: the original's output (and graph), ours compared without a graph
    assert seen == [4, 2]
    assert entry['state'] == 'grouped' and entry['relative_difference'] < 1e-5
    for got, want in zip(first, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)

    calls = G.CALLS['grouped']
    seen.clear()
    got = forward_and_grads(model)
    assert seen == [2]  # from now on the kernel gets the 2 key heads
    assert G.CALLS['grouped'] == calls + 1  # one call counted once (installing and the check's decision count none)
    for g, want in zip(got, expected):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)
    assert patches.patched_by(M.Qwen3_5MoeGatedDeltaNet.forward) == 'gdn_qk_grouped_heads_qwen3_5_moe'


def test_torch_reference_kernel_keeps_the_repeat(restore):
    model = gdn_layer()
    before = M.Qwen3_5MoeGatedDeltaNet.forward
    state = G.install(model, ON)
    entry = state['classes']['Qwen3_5MoeGatedDeltaNet']
    assert entry['state'].startswith('kept its forward: the chunk kernel is transformers torch_chunk_gated_delta_rule '
                                     '(PyTorch reference)')
    assert 'takes no grouped heads' in entry['state']
    assert M.Qwen3_5MoeGatedDeltaNet.forward is before


def test_switch_off_touches_nothing(restore):
    M.torch_chunk_gated_delta_rule = fake_fla([])
    before = M.Qwen3_5MoeGatedDeltaNet.forward
    for env in ({}, {G.ENV: 'repeat'}):
        assert G.install(gdn_layer(), env) == {'setting': 'repeat'}
    assert M.Qwen3_5MoeGatedDeltaNet.forward is before


def test_only_the_chunked_path_with_flas_kernel_groups():
    fla = fake_fla([])
    assert G.kernel_groups(fla, decode_step=False)
    assert not G.kernel_groups(fla, decode_step=True)  # the recurrent decode kernel keeps its repeated inputs
    assert not G.kernel_groups(REFERENCE, decode_step=False)
    assert G.kernel_name(REFERENCE) == 'transformers torch_chunk_gated_delta_rule (PyTorch reference)'
    # Unsloth's compiled module re-decorates the hub wrapper (torch_compiler_disable_unless_decode keeps it as
    # __wrapped__): looked through, to fla's function or to nothing
    assert G.kernel_groups(unsloth_disabled(fake_fla([])), decode_step=False)
    assert not G.kernel_groups(unsloth_disabled(REFERENCE), decode_step=False)


def test_a_kernels_verdict_is_its_own():
    """Decided once per kernel, and only for that kernel: a function created where a refused one was freed (CPython
    hands out its address again) is judged afresh."""
    for _ in range(50):
        reference = unsloth_disabled(REFERENCE)
        assert not G.takes_grouped_heads(reference)
        del reference
        assert G.takes_grouped_heads(unsloth_disabled(fake_fla([])))


def test_a_kernel_that_refuses_grouped_heads_keeps_the_forward(restore):
    seen = []
    M.torch_chunk_gated_delta_rule = fake_fla(seen, refuse_groups=True)
    model = gdn_layer()
    expected = forward_and_grads(model)
    state = G.install(model, ON)
    got = forward_and_grads(model)
    entry = state['classes']['Qwen3_5MoeGatedDeltaNet']
    assert entry['state'].startswith('kept its forward: the grouped call failed (ValueError: q has 2 heads')
    assert patches.patched_by(M.Qwen3_5MoeGatedDeltaNet.forward) is None
    for g, want in zip(got, expected):
        torch.testing.assert_close(g, want, rtol=0, atol=0)
    seen.clear()
    forward_and_grads(model)
    assert seen == [4]


class NoPastCache:
    """What the forward asks of a cache on a prefill call: no previous state; the states it hands over are taken."""
    def __init__(self):
        self.updates = 0

    def has_previous_state(self, *args, **kwargs):
        return False

    def update_conv_state(self, states, *args, **kwargs):
        self.updates += 1
        return states

    def update_recurrent_state(self, *args, **kwargs):
        self.updates += 1


def test_a_call_with_a_cache_is_left_to_the_original_and_the_check_waits(restore):
    seen = []
    M.torch_chunk_gated_delta_rule = fake_fla(seen)
    model = gdn_layer()
    entry = G.install(model, ON)['classes']['Qwen3_5MoeGatedDeltaNet']
    cache = NoPastCache()
    with torch.no_grad():
        model['linear_attn'](torch.randn(1, 70, 32), cache_params=cache)
    assert seen == [4] and cache.updates == 2  # the original alone: the cache updated once
    assert entry['state'] == 'installed, waiting for its first call'
    forward_and_grads(model)
    assert entry['state'] == 'grouped'


def unsloth_compiled_module(tmp_path, name, edit=lambda source: source):
    """A module shaped like the one Unsloth's compiler writes for Qwen3.5-MoE, written by hand (CI has no wheels to
    generate it: tests/unsloth_compiled.py does where it has): transformers' forward renamed
    `Qwen3_5MoeGatedDeltaNet_forward` at module level under Unsloth's disable decorator, and the class's forward one
    call of it, under the generated module's prelude. `edit` changes the copy's source."""
    forward = textwrap.dedent(inspect.getsource(patches.upstream(M.Qwen3_5MoeGatedDeltaNet.forward)))
    forward = edit(forward.replace('def forward(', 'def Qwen3_5MoeGatedDeltaNet_forward(', 1))
    return unsloth_compiled.load_module(tmp_path, name, '\n'.join([
        '@torch_compiler_disable_unless_decode',
        forward,
        '',
        'class Qwen3_5MoeGatedDeltaNet(_modeling.Qwen3_5MoeGatedDeltaNet):',
        '    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):',
        '        return Qwen3_5MoeGatedDeltaNet_forward(self, hidden_states=hidden_states, cache_params=cache_params, '
        'attention_mask=attention_mask, **kwargs)',
        '']))


def as_compiled(model, module):
    model['linear_attn'].__class__ = module.Qwen3_5MoeGatedDeltaNet
    return model


def test_unsloths_copy_is_rewritten_in_its_own_module(tmp_path, restore):
    compiled = unsloth_compiled_module(tmp_path, 'unsloth_compiled_module_qwen3_5_moe_test')
    seen = []
    compiled.torch_chunk_gated_delta_rule = fake_fla(seen)  # the copy reads its own module's kernel
    model = as_compiled(gdn_layer(), compiled)
    expected = forward_and_grads(model)
    transformers_forward = M.Qwen3_5MoeGatedDeltaNet.forward
    state = G.install(model, ON)
    entry = state['classes']['Qwen3_5MoeGatedDeltaNet']
    assert entry['what'] == 'unsloth copy'
    assert entry['forward'].endswith('.Qwen3_5MoeGatedDeltaNet_forward')
    forward_and_grads(model)
    assert entry['state'] == 'grouped'
    seen.clear()
    got = forward_and_grads(model)
    assert seen == [2]
    for g, want in zip(got, expected):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)
    assert M.Qwen3_5MoeGatedDeltaNet.forward is transformers_forward  # only the compiled class changed


def test_the_copy_is_rewritten_where_unsloth_put_its_class_in_the_modeling_module(tmp_path, restore, monkeypatch):
    """As on the GPU machine: Unsloth's compiler sets a class of its own (an nn.Module, not a subclass) in
    transformers' modeling module in place of transformers' class, so `modeling:Qwen3_5MoeGatedDeltaNet.forward`
    names its one-line forward. The inventory still checks transformers' own forward, read from the modeling file,
    and the copy is compared with it and rewritten -- before, both read the one line ("no longer uses ..."), and the
    lever kept the repeat without running."""
    compiled = unsloth_compiled_module(tmp_path, 'unsloth_compiled_module_qwen3_5_moe_in_place')
    seen = []
    compiled.torch_chunk_gated_delta_rule = fake_fla(seen)
    transformers_source = inspect.getsource(patches.upstream(M.Qwen3_5MoeGatedDeltaNet.forward))
    model = as_compiled(gdn_layer(), compiled)
    expected = forward_and_grads(model)
    generated = type('Qwen3_5MoeGatedDeltaNet', (torch.nn.Module,), {
        '__module__': M.__name__, 'forward': compiled.Qwen3_5MoeGatedDeltaNet.forward})
    monkeypatch.setattr(M, 'Qwen3_5MoeGatedDeltaNet', generated)
    monkeypatch.setattr(patches, '_checked', {})  # decided once per process: decide it again with the class replaced
    name = G.CLASS_PATCHES['Qwen3_5MoeGatedDeltaNet']
    assert inspect.getsource(patches.resolve(patches.BY_NAME[name].target)) == transformers_source
    assert patches.check(name) is None
    entry = G.install(model, ON)['classes']['Qwen3_5MoeGatedDeltaNet']
    assert entry['what'] == 'unsloth copy', entry
    forward_and_grads(model)
    assert entry['state'] == 'grouped', entry
    seen.clear()
    got = forward_and_grads(model)
    assert seen == [2]  # the kernel got the 2 key heads as they are
    for g, want in zip(got, expected):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)


def test_a_forward_replaced_on_transformers_class_itself_is_read_as_it_is_and_refused(monkeypatch):
    """Only a class the modeling module no longer defines is read from the file: a forward another library replaced
    on transformers' own class is what the inventory checks, and it does not know it."""
    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
        return hidden_states
    monkeypatch.setattr(M.Qwen3_5MoeGatedDeltaNet, 'forward', forward)
    monkeypatch.setattr(patches, '_checked', {})
    name = G.CLASS_PATCHES['Qwen3_5MoeGatedDeltaNet']
    assert patches.resolve(patches.BY_NAME[name].target) is forward
    assert 'no longer uses' in patches.check(name)


def test_a_copy_with_other_statements_keeps_its_forward(tmp_path, restore):
    compiled = unsloth_compiled_module(
        tmp_path, 'unsloth_compiled_module_qwen3_5_moe_edited',
        edit=lambda s: s.replace('beta = b.sigmoid()', 'beta = b.sigmoid().clamp(max=0.99)'))
    compiled.torch_chunk_gated_delta_rule = fake_fla([])
    model = as_compiled(gdn_layer(), compiled)
    before = compiled.Qwen3_5MoeGatedDeltaNet.forward
    entry = G.install(model, ON)['classes']['Qwen3_5MoeGatedDeltaNet']
    assert entry['state'].startswith("kept its forward: Unsloth's Qwen3_5MoeGatedDeltaNet_forward is not "
                                     "transformers' forward: statement")
    assert "beta = b.sigmoid().clamp(max=0.99)" in entry['state']
    assert compiled.Qwen3_5MoeGatedDeltaNet.forward is before


def test_the_runner_names_the_kernel_the_models_forward_calls(tmp_path, restore):
    """`linear_attention_kernel` (the runner's record, and what its Hopper warning reads) looks where the forward that
    runs looks: Unsloth's generated module binds a global of its own, which may differ from transformers'."""
    from swift_vora.backends.unsloth_runner import linear_attention_kernel
    reference = 'transformers torch_chunk_gated_delta_rule (PyTorch reference)'
    fla = 'fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule'
    model = gdn_layer()
    assert linear_attention_kernel(model) == linear_attention_kernel() == reference
    M.torch_chunk_gated_delta_rule = fake_fla([])
    assert linear_attention_kernel(model) == fla
    M.torch_chunk_gated_delta_rule = REFERENCE
    compiled = unsloth_compiled_module(tmp_path, 'unsloth_compiled_module_qwen3_5_moe_kernel')
    compiled.torch_chunk_gated_delta_rule = unsloth_disabled(fake_fla([]))
    assert linear_attention_kernel(as_compiled(gdn_layer(), compiled)) == fla
    assert linear_attention_kernel() == reference  # transformers' module alone would have said so


def test_statements_ignore_decorators_signature_and_comments():
    a = '@deco\ndef f(\n    self,\n    x,\n):\n    y = x  # note\n    # a comment\n    return y\n'
    b = '    def g(self, x):\n        y = x\n        return y\n'
    assert G.same_statements(a, b) is None
    assert G.same_statements(a, b.replace('return y', 'return x')).startswith('statement 2:')


def test_inventory_pins_the_installed_forward():
    for name in ('gdn_qk_grouped_heads_qwen3_5_moe', 'gdn_qk_grouped_heads_qwen3_5', 'gdn_qk_grouped_heads_qwen3_next'):
        assert patches.check(name) is None, name


@pytest.mark.gpu
def test_flas_grouped_kernel_matches_the_repeat_on_gpu():
    """fla's own kernel as the Unsloth runner binds it (unsloth_zoo's vendored snapshot, registered as `fla` when
    unsloth is imported, or a newer installed fla): grouped query/key against their repeat, forward and backward."""
    if not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU: fla\'s chunk_gated_delta_rule is a Triton kernel')
    pytest.importorskip('unsloth', reason='Unsloth is installed with the GPU machine\'s MoE wheel set '
                        '(scripts/gpu/fetch_wheels.sh moe; run_all.sh installs it for the moe phases)')
    fla = pytest.importorskip('fla.ops.gated_delta_rule', reason='no fla bound: neither unsloth_zoo\'s vendored '
                              'snapshot nor an installed flash-linear-attention')
    torch.manual_seed(0)
    B, T, H, HV, K, V = 2, 200, 4, 8, 64, 64
    q, k = (torch.randn(B, T, H, K, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, HV, V, device='cuda', dtype=torch.bfloat16, requires_grad=True)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device='cuda')).requires_grad_()
    beta = torch.rand(B, T, HV, device='cuda', dtype=torch.bfloat16).requires_grad_()
    w = torch.randn(B, T, HV, V, device='cuda', dtype=torch.bfloat16)

    def run(grouped):
        for t in (q, k, v, g, beta):
            t.grad = None
        qq, kk = (q, k) if grouped else (q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2))
        o, _ = fla.chunk_gated_delta_rule(qq, kk, v, g, beta, use_qk_l2norm_in_kernel=True)
        (o.float() * w.float()).sum().backward()
        return [o.detach().float()] + [t.grad.float() for t in (q, k, v, g, beta)]

    for got, want in zip(run(True), run(False)):
        scale = want.abs().max().clamp_min(1e-6)
        assert float((got - want).abs().max() / scale) < 2e-2


RUN_WITH_FAKE_FLA = '''import runpy, sys
sys.path.insert(0, {tests!r})
from test_gdn_qk_heads import fake_fla
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
modeling_qwen3_5_moe.torch_chunk_gated_delta_rule = fake_fla([])
sys.argv = ['unsloth_runner', *sys.argv[1:]]
runpy.run_module('swift_vora.backends.unsloth_runner', run_name='__main__')
'''


@pytest.mark.slow
def test_runner_trains_the_same_with_grouped_heads(tiny_qwen3_5_moe_dir, tmp_path, offline_env):
    """The Unsloth runner (its PEFT loader on the CPU) with SWIFT_VORA_GDN_QK_HEADS=grouped and fla's contract bound:
    the record says the class runs grouped and counts the grouped calls; the losses are the repeat's."""
    import json
    import subprocess
    import sys

    from swift_vora.synthetic import make_dataset
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ann = make_dataset(str(tmp_path / 'data'), 2, duration=16.0)
    script = tmp_path / 'run_with_fake_fla.py'
    script.write_text(RUN_WITH_FAKE_FLA.format(tests=os.path.join(repo, 'tests')))
    runs = {}
    for setting in ('repeat', 'grouped'):
        out = tmp_path / setting
        cmd = [sys.executable, str(script), os.path.join(repo, 'recipes', 'h200x1.yaml'),
               f'model.path={tiny_qwen3_5_moe_dir}', f'data.dataset={ann}', 'data.window=8', 'data.stride=8',
               'video.fps=1', 'video.max_frames=8', 'video.pair_tokens=16', 'video.min_pair_tokens=4',
               'train.max_steps=2', 'train.micro_batch=2', 'train.grad_accum=1', 'train.dtype=float32',
               f'train.output_dir={out}', 'train.lora_rank=4', 'unsloth.save_merged=false',
               'unsloth.gradient_checkpointing=false', '--loader', 'peft']
        env = {**offline_env, G.ENV: setting, 'SWIFT_VORA_GUARDS': 'supervision'}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[setting] = (json.loads((out / 'unsloth_run_result.json').read_text()),
                         [json.loads(line)['loss'] for line in (out / 'train_log.jsonl').read_text().splitlines()])
    (plain, plain_losses), (grouped, grouped_losses) = runs['repeat'], runs['grouped']
    assert plain['gdn_qk_heads'] == {'setting': 'repeat'}
    entry = grouped['gdn_qk_heads']['classes']['Qwen3_5MoeGatedDeltaNet']
    assert entry['state'] == 'grouped' and entry['what'] == 'class', entry
    layers = 3  # the tiny model's Gated DeltaNet layers; every training forward after the check ran grouped
    assert grouped['gdn_qk_heads']['grouped_calls'] >= layers
    assert len(grouped_losses) == 2
    torch.testing.assert_close(torch.tensor(grouped_losses), torch.tensor(plain_losses), rtol=1e-5, atol=0)


@pytest.mark.skipif(not unsloth_compiled.WHEELS, reason=unsloth_compiled.MISSING)
def test_the_class_unsloths_compiler_generates_runs_grouped(tmp_path, restore):
    """Unsloth's compiler (read from the wheel, run on this transformers) writes the Qwen3.5-MoE Gated DeltaNet class
    it trains with -- claiming transformers' module as its own, as Unsloth's generated module does: its one-line
    forward and `Qwen3_5MoeGatedDeltaNet_forward` are recognised as transformers' statements, rewritten, and give the
    repeat's outputs and gradients."""
    compiled = unsloth_compiled.compiled_module(tmp_path, 'unsloth_compiled_module_generated',
                                                ('Qwen3_5MoeGatedDeltaNet', True))
    assert compiled.Qwen3_5MoeGatedDeltaNet.__module__ == M.__name__
    seen = []
    # the compiled module re-decorates transformers' kernel wrapper as it does (compiler.py: the hub decorator, then
    # torch_compiler_disable_unless_decode)
    compiled.torch_chunk_gated_delta_rule = unsloth_disabled(fake_fla(seen))
    model = as_compiled(gdn_layer(), compiled)
    expected = forward_and_grads(model)
    entry = G.install(model, ON)['classes']['Qwen3_5MoeGatedDeltaNet']
    assert entry['what'] == 'unsloth copy', entry
    assert entry['defined_at'].startswith(str(tmp_path / 'unsloth_compiled_module_generated.py'))
    forward_and_grads(model)
    assert entry['state'] == 'grouped', entry
    seen.clear()
    got = forward_and_grads(model)
    assert seen == [2]
    for g, want in zip(got, expected):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)
