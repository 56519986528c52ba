"""Guard `zero3_load` (and the LoRA tracker) on real DeepSpeed ZeRO-3 partitions: two CPU processes, gloo.

What runs: `torchrun --nproc_per_node 2` with DeepSpeed's CPU accelerator; the tiny Qwen3-VL is loaded by
transformers' `from_pretrained` under `HfDeepSpeedConfig` (stage 3), i.e. inside `deepspeed.zero.Init` exactly as
the HF/ms-swift Trainer does it, wrapped with PEFT LoRA, verified, then trained for two steps by a
`deepspeed.initialize` engine. What does not run here: `swift sft --deepspeed zero3` itself -- transformers 5.17
gives DeepSpeed no process-group backend without CUDA (`TrainingArguments` passes `ddp_backend` only to plain
DDP), so the DeepSpeed config resolves `train_batch_size` for world size 1 and the run stops at load.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import swift  # noqa: F401  (a test dependency: pyproject [test])
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.distributed as dist
    import deepspeed
    import peft
    from transformers import Qwen3VLForConditionalGeneration
    from transformers.integrations import HfDeepSpeedConfig

    from swift_vora.guards.lora_update import AdapterTracker
    from swift_vora.guards.zero3_load import summary_line, verify_loaded_weights

    model_dir, broken_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
    deepspeed.init_distributed(dist_backend='gloo')
    rank = dist.get_rank()
    results = {}
    config = {'train_micro_batch_size_per_gpu': 1, 'gradient_accumulation_steps': 1, 'train_batch_size': 2,
              'zero_optimization': {'stage': 3, 'stage3_param_persistence_threshold': 0}, 'steps_per_print': 10**9}
    keep = HfDeepSpeedConfig(config)  # as the Trainer does: from_pretrained now loads under zero.Init


    def load(path):
        model = Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
        return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=['q_proj', 'v_proj', 'down_proj']))


    model = load(model_dir)
    name = 'base_model.model.model.language_model.layers.0.mlp.down_proj.base_layer.weight'
    param = dict(model.named_parameters())[name]
    results['partitioned'] = {'shape': list(param.shape), 'ds_shape': list(param.ds_shape)}
    report = verify_loaded_weights(model, model_dir)
    results['clean'] = {'ok': report['ok'], 'line': summary_line(report), 'matched': report['matched'],
                        'tensors': report['checkpoint_tensors']}
    with torch.no_grad():  # one rank's partition of one tensor differs from the checkpoint
        if rank == 1:
            param.ds_tensor.add_(1.0)
    report = verify_loaded_weights(model, model_dir)
    results['corrupted'] = {'ok': report['ok'], 'different': [d['key'] for d in report['different']]}
    with torch.no_grad():
        if rank == 1:
            param.ds_tensor.sub_(1.0)

    broken = load(broken_dir)  # loads without an error: the unmapped parameter stays at its random init
    report = verify_loaded_weights(broken, broken_dir)
    results['broken_keys'] = {'ok': report['ok'], 'unmapped': report['unmapped_checkpoint_keys'],
                              'not_in_checkpoint': report['params_not_in_checkpoint'], 'line': summary_line(report)}
    del broken

    frozen = 'base_model.model.model.language_model.layers.1.self_attn.v_proj.lora_B.default.weight'
    dict(model.named_parameters())[frozen].requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    tracker = AdapterTracker(model)
    results['lora_partitioned'] = all(p.data.numel() == 0 and p.ds_tensor.numel() > 0 for p in tracker.params)
    tracker.snapshot()
    ids = torch.tensor([[10, 20, 30, 40, 50, 60, 70, 80]]) + rank
    for step in range(2):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        changed = tracker.changed_since_baseline()
        results[f'after_step{step + 1}'] = {
            'B': sum(c for c, k in zip(changed, tracker.kinds) if k == 'B'),
            'A': sum(c for c, k in zip(changed, tracker.kinds) if k == 'A'), 'of': len(changed),
            'unchanged': [n for n, c in zip(tracker.names, changed) if not c]}
    with open(os.path.join(out, f'rank{rank}.json'), 'w') as f:
        json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()  # a gloo rank exiting with its group alive can abort (pytorch/pytorch#190489)
''')


def _write_checkpoint_variant(src, dst, rename):
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    tensors = load_file(os.path.join(src, 'model.safetensors'))
    renamed = {rename(k): v for k, v in tensors.items()}
    save_file(renamed, os.path.join(dst, 'model.safetensors'), metadata={'format': 'pt'})
    return str(dst)


def test_key_layouts_map_onto_the_model(tiny_model_dir, tmp_path):
    """Old-style keys (`model.layers.*`, `visual.*`) and PEFT-wrapped names map; a renamed key does not."""
    import peft
    from transformers import Qwen3VLForConditionalGeneration

    from swift_vora.guards.zero3_load import canonical, verify_loaded_weights
    assert canonical('model.language_model.layers.0.mlp.up_proj.weight') == \
        canonical('model.layers.0.mlp.up_proj.weight') == \
        canonical('base_model.model.model.language_model.layers.0.mlp.up_proj.base_layer.weight')
    assert canonical('visual.blocks.0.attn.qkv.weight') == canonical('model.visual.blocks.0.attn.qkv.weight')
    assert canonical('base_model.model.model.language_model.layers.0.mlp.up_proj.lora_A.default.weight') is None

    model = peft.get_peft_model(Qwen3VLForConditionalGeneration.from_pretrained(tiny_model_dir, dtype=torch.float32),
                                peft.LoraConfig(r=4, target_modules=['q_proj']))
    old = _write_checkpoint_variant(tiny_model_dir, tmp_path / 'old_layout', lambda k: k.replace(
        'model.language_model.', 'model.').replace('model.visual.', 'visual.'))
    report = verify_loaded_weights(model, old)  # same values, other key layout
    assert report['ok'] and report['matched'] == report['checkpoint_tensors'] == 63
    with torch.no_grad():
        model.base_model.model.lm_head.weight.mul_(1.5)  # tied to embed_tokens: one tensor, two names
    report = verify_loaded_weights(model, tiny_model_dir)
    assert not report['ok'] and [d['key'] for d in report['different']] == \
        ['model.language_model.embed_tokens.weight']


@pytest.mark.slow
def test_two_process_zero3_load_and_lora_tracking(tiny_model_dir, tmp_path):
    import deepspeed  # noqa: F401  (a test dependency: pyproject [test])
    broken = _write_checkpoint_variant(tiny_model_dir, tmp_path / 'broken', lambda k: k + 's' if k == (
        'model.language_model.layers.1.mlp.down_proj.weight') else k)
    script = tmp_path / 'zero3_check.py'
    script.write_text(SCRIPT)
    env = {**os.environ, 'DS_ACCELERATOR': 'cpu', 'OMP_NUM_THREADS': '1', 'PYTHONPATH': REPO,
           'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1'}
    torchrun = os.path.join(os.path.dirname(sys.executable), 'torchrun')
    argv = [torchrun, '--nproc_per_node', '2', '--master_port', str(29700 + os.getpid() % 200), str(script),
            str(tiny_model_dir), broken, str(tmp_path)]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # Reproduce: transformers loads the broken checkpoint under ZeRO-3 without an error (a log table only).
    assert 'MISSING' in proc.stdout + proc.stderr
    for rank in (0, 1):
        res = json.load(open(tmp_path / f'rank{rank}.json'))
        assert res['partitioned'] == {'shape': [0], 'ds_shape': [64, 128]}
        assert res['clean']['ok'] and res['clean']['line'].startswith('63 of 63 checkpoint tensors match (ZeRO-3')
        # a difference in rank 1's partition is seen by both ranks
        assert not res['corrupted']['ok'] and res['corrupted']['different'] == [
            'model.language_model.layers.0.mlp.down_proj.weight']
        assert not res['broken_keys']['ok']
        assert res['broken_keys']['unmapped'] == ['model.language_model.layers.1.mlp.down_proj.weights']
        assert res['broken_keys']['not_in_checkpoint'] == [
            'base_model.model.model.language_model.layers.1.mlp.down_proj.base_layer.weight']
        # LoRA tracking on partitions (ds_tensor): all but the frozen lora_B move; the flags agree on both ranks
        assert res['lora_partitioned']
        frozen = ['base_model.model.model.language_model.layers.1.self_attn.v_proj.lora_B.default.weight']
        assert res['after_step1']['B'] == 5 and res['after_step1']['unchanged'] == frozen
        assert res['after_step2'] == {'B': 5, 'A': 6, 'of': 12, 'unchanged': frozen}


@pytest.mark.slow
def test_load_check_inside_the_trainer_two_ranks(guards_ddp_run):
    """The same comparison wired through the callback in a real 2-process `swift sft` (DDP, not partitioned)."""
    assert guards_ddp_run['rc'] == 0, guards_ddp_run['log'][-3000:]
    report = json.load(open(os.path.join(guards_ddp_run['run_dir'], 'zero3_load.json')))
    assert report['ok'] and report['world_size'] == 2 and report['zero3'] is False
    assert report['matched'] == report['checkpoint_tensors'] == 63 and report['params_not_in_checkpoint'] == []
    assert 'swift-vora zero3_load: 63 of 63 checkpoint tensors match' in guards_ddp_run['log']
