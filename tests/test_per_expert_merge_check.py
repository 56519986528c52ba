"""The expert check of a Megatron-SWIFT merge (swift_vora/backends/per_expert_merge_check.py, run by
scripts/merge_for_vllm.sh): Megatron exports its expert LoRA in the hub's per-expert names and writes the merged
weights in transformers' fused layout, while the base holds the experts one by one (#31 item 1: "passes the expert
check"). What a user relies on: a correct merge passes with the delta visible; experts permuted, gate and up halves
swapped, the scale forgotten or a fused tensor of another layout are caught, naming what; nothing but the sampled
tensors is read."""
import json
import os
import shutil

import pytest
import torch

from swift_vora.backends.merge import MergeError, merge
from swift_vora.backends.per_expert_merge_check import (
    ExpertLayoutError,
    check_per_expert_merge,
    has_per_expert_adapters,
)

RANK, ALPHA = 4, 8


def sizes(base):
    with open(os.path.join(base, 'config.json')) as f:
        text = json.load(f)['text_config']
    return text['num_hidden_layers'], text['num_experts'], text['hidden_size'], text['moe_intermediate_size']


def megatron_run(base, root, fault=None, attention_delta=0.0):
    """checkpoint-7 (args.json, the per-expert adapter as mcore-bridge exports it: one lora_A for gate and up) and
    checkpoint-7-merged (base + scale * B @ A, rounded to bf16 as Megatron's bf16 weights are, written fused)."""
    from safetensors.torch import load_file, save_file
    layers, experts, hidden, inter = sizes(base)
    g = torch.Generator().manual_seed(0)
    ckpt, merged_dir = os.path.join(root, 'checkpoint-7'), os.path.join(root, 'checkpoint-7-merged')
    os.makedirs(ckpt)
    args = {'model': base, 'expert_model_parallel_size': 1, 'tuner_type': 'lora'}
    with open(os.path.join(ckpt, 'args.json'), 'w') as f:
        json.dump(args, f)
    with open(os.path.join(ckpt, 'adapter_config.json'), 'w') as f:
        json.dump({'r': RANK, 'lora_alpha': ALPHA, 'peft_type': 'LORA', 'rank_pattern': {}, 'alpha_pattern': {}}, f)
    weights = load_file(os.path.join(base, 'model.safetensors'))
    adapter, merged = {}, {k: v for k, v in weights.items() if '.mlp.experts.' not in k}
    for k in merged:
        if '.self_attn.' in k and k.endswith('proj.weight'):  # attention LoRA merged too (not checked here)
            merged[k] = merged[k] + attention_delta
    scale = 1.0 if fault == 'no_scale' else ALPHA / RANK
    for layer in range(layers):
        prefix = f'model.language_model.layers.{layer}.mlp.experts'
        gate_up, down = [], []
        for e in range(experts):
            a_fc1 = torch.randn(RANK, hidden, generator=g) * 0.1
            b_fc1 = torch.randn(2 * inter, RANK, generator=g) * 0.1
            a_fc2 = torch.randn(RANK, inter, generator=g) * 0.1
            b_fc2 = torch.randn(hidden, RANK, generator=g) * 0.1
            for proj, a, b in (('gate_proj', a_fc1, b_fc1[:inter]), ('up_proj', a_fc1, b_fc1[inter:]),
                               ('down_proj', a_fc2, b_fc2)):
                key = f'base_model.model.{prefix}.{e}.{proj}'
                adapter[f'{key}.lora_A.weight'], adapter[f'{key}.lora_B.weight'] = a.bfloat16(), b.bfloat16()
            new = {}
            for proj in ('gate_proj', 'up_proj', 'down_proj'):
                a = adapter[f'base_model.model.{prefix}.{e}.{proj}.lora_A.weight'].float()
                b = adapter[f'base_model.model.{prefix}.{e}.{proj}.lora_B.weight'].float()
                delta = (b @ a * scale).bfloat16()  # Megatron: the delta in bf16, then the bf16 addition
                new[proj] = weights[f'{prefix}.{e}.{proj}.weight'].bfloat16() + delta
            halves = (new['up_proj'], new['gate_proj']) if fault == 'swap_halves' else (new['gate_proj'],
                                                                                         new['up_proj'])
            gate_up.append(torch.cat(halves))
            down.append(new['down_proj'])
        if fault == 'permute':
            gate_up = gate_up[1:] + gate_up[:1]
        merged[f'{prefix}.gate_up_proj'] = torch.stack(gate_up)
        merged[f'{prefix}.down_proj'] = torch.stack(down)
        if fault == 'transposed':  # [E, I, H]: the tiny model's 2I equals H, so gate_up's transpose has its shape
            merged[f'{prefix}.down_proj'] = merged[f'{prefix}.down_proj'].transpose(1, 2).contiguous()
    save_file(adapter, os.path.join(ckpt, 'adapter_model.safetensors'))
    shutil.copytree(base, merged_dir, ignore=shutil.ignore_patterns('*.safetensors'))
    save_file({k: v.contiguous() for k, v in merged.items()}, os.path.join(merged_dir, 'model.safetensors'),
              metadata={'format': 'pt'})
    with open(os.path.join(merged_dir, 'args.json'), 'w') as f:
        json.dump(args, f)
    return ckpt, merged_dir


def test_a_megatron_merge_passes_the_expert_check_through_merge_for_vllm(tiny_qwen3_5_moe_dir, tmp_path):
    ckpt, _ = megatron_run(tiny_qwen3_5_moe_dir, str(tmp_path))
    assert has_per_expert_adapters(ckpt)
    report = merge(ckpt, str(tmp_path / 'out'), base=tiny_qwen3_5_moe_dir)
    check = report['expert_check']
    assert report['source'] == 'megatron' and check['ok'] and check['elements_telling'] > 0
    layers, _, _, _ = sizes(tiny_qwen3_5_moe_dir)
    assert check['layers'] == [0, layers - 1] and check['checked'] == 2 * 3 * 3  # 2 layers x 3 experts x 3 proj
    saved = json.loads((tmp_path / 'out' / 'swift_vora_merge_check.json').read_text())
    assert saved['trained'] and saved['scale'] == ALPHA / RANK


@pytest.mark.parametrize('fault', ['swap_halves', 'no_scale', 'permute'])
def test_a_wrong_megatron_export_is_caught(tiny_qwen3_5_moe_dir, tmp_path, fault):
    """Each loads in transformers and generates text; the check names the tensors that differ."""
    ckpt, merged_dir = megatron_run(tiny_qwen3_5_moe_dir, str(tmp_path), fault=fault)
    report = check_per_expert_merge(ckpt, tiny_qwen3_5_moe_dir, merged_dir)
    assert not report['ok']
    bad = {c['tensor'].rsplit('.', 2)[-2] for c in report['checks'] if not c['ok']}
    assert bad == ({'gate_proj', 'up_proj'} if fault in ('swap_halves', 'permute')
                   else {'gate_proj', 'up_proj', 'down_proj'})
    with pytest.raises(MergeError, match='merged expert weights differ'):
        merge(ckpt, str(tmp_path / 'out'), base=tiny_qwen3_5_moe_dir)
    assert not (tmp_path / 'out').exists()


def test_a_fused_tensor_in_another_layout_is_refused_not_guessed(tiny_qwen3_5_moe_dir, tmp_path):
    ckpt, merged_dir = megatron_run(tiny_qwen3_5_moe_dir, str(tmp_path), fault='transposed')
    with pytest.raises(ExpertLayoutError, match='down_proj is .* fused layout'):
        check_per_expert_merge(ckpt, tiny_qwen3_5_moe_dir, merged_dir)
    with pytest.raises(MergeError, match='expert check: .*layout this check cannot read'):
        merge(ckpt, str(tmp_path / 'out'), base=tiny_qwen3_5_moe_dir)


def test_only_the_sampled_tensors_are_read(tiny_qwen3_5_moe_dir, tmp_path, monkeypatch):
    """At full depth a whole expert tensor of every layer would be 65 GiB: the check reads one expert at a time."""
    from swift_vora.backends import per_expert_merge_check as mod
    ckpt, merged_dir = megatron_run(tiny_qwen3_5_moe_dir, str(tmp_path))
    read = []
    real = mod.Checkpoint.read

    def spy(self, key, index=None):
        read.append((os.path.basename(self.dir), key, index))
        return real(self, key, index)
    monkeypatch.setattr(mod.Checkpoint, 'read', spy)
    report = check_per_expert_merge(ckpt, tiny_qwen3_5_moe_dir, merged_dir)
    assert report['ok']
    fused = [r for r in read if r[0] == 'checkpoint-7-merged' and '.experts.' in r[1]]
    assert fused and all(index is not None for _, _, index in fused)  # one expert's slice of a fused tensor
    assert len(read) == 2 * report['checked']  # one base and one merged read per checked tensor


def test_megatron_benchmarks_flagship_records_the_expert_check(tiny_qwen3_5_moe_dir, tmp_path):
    """benchmarks/megatron_moe.py's item-1 report runs merge_for_vllm.sh and keeps its expert check; a run whose
    merge ran none fails (#31 item 1: "passes merge_for_vllm.sh's expert check", not only "loads")."""
    import sys
    import types
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'benchmarks'))
    import megatron_moe as mm
    out, vdir = tmp_path / 'output', tmp_path / 'variant'
    run = out / 'v0-20261205'
    os.makedirs(run)
    os.makedirs(vdir)
    megatron_run(tiny_qwen3_5_moe_dir, str(run), attention_delta=0.01)
    with open(run / 'logging.jsonl', 'w') as f:
        for i, loss in enumerate([12.0, 10.0, 8.0, 6.0, 5.0, 4.0, 3.0], 1):
            f.write(json.dumps({'loss': loss, 'iteration': f'{i}/7', 'memory(GiB)': 10.0,
                                'train_speed(s/it)': 1.0}) + '\n')
    plan = tmp_path / 'plan.json'
    plan.write_text(json.dumps({'plan': {'backend': 'megatron_ep_lora', 'gpu_peak_gib': 12.0,
                                         'phases': {'steady': {'gpu_reserved_gib': 11.0}}}}))
    args = types.SimpleNamespace(steps=7, global_batch=2, megatron_site='')
    report = mm.flagship_report(str(out), tiny_qwen3_5_moe_dir, str(plan), args, str(vdir))
    assert report['merge_for_vllm_rc'] == 0, report['merge_for_vllm_tail']
    assert report['expert_check']['ok'] and report['expert_check']['trained']
    assert (vdir / 'swift_vora_merge_check.json').is_file()
    assert report['failures'] == [], report['failures']
    assert report['weights_changed']['experts'] > 0 and report['merged_loads'] is True

    os.remove(run / 'checkpoint-7' / 'adapter_model.safetensors')  # nothing for the check to compare with
    shutil.rmtree(vdir)
    os.makedirs(vdir)
    report = mm.flagship_report(str(out), tiny_qwen3_5_moe_dir, str(plan), args, str(vdir))
    assert any('ran no expert check' in f for f in report['failures']), report['failures']
