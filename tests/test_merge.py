"""scripts/merge_for_vllm.sh: detection of the adapter's origin, the staged write + rename, the refusal to
overwrite, the checks on the merged weights, and logits of the merged model = base + adapter."""
import json
import os
import shutil
import subprocess

import pytest

from swift_vora.backends.merge import MergeError, detect_source, merge, verify_merged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'scripts', 'merge_for_vllm.sh')


def run_script(*args):
    return subprocess.run(['bash', SCRIPT, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=600)


def randomize_lora_b(adapter_dir, std=0.5, seed=0):
    """LoRA B starts at zero and two tiny steps barely move it: give it a large random value so that the merge
    visibly changes the model (otherwise base == merged and the test proves nothing)."""
    import torch
    from safetensors.torch import load_file, save_file
    path = os.path.join(adapter_dir, 'adapter_model.safetensors')
    weights = load_file(path)
    g = torch.Generator().manual_seed(seed)
    for k, v in weights.items():
        if 'lora_B' in k:
            weights[k] = torch.randn(v.shape, generator=g, dtype=torch.float32).to(v.dtype) * std
    save_file(weights, path, metadata={'format': 'pt'})


def logits_of(model, tokens=(1, 2, 3, 4, 5, 6, 7, 8)):
    import torch
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(tokens)])).logits.float()


def reference_logits(base_dir, adapter_dir):
    """(base, base+adapter unmerged, base+adapter merged in fp32 then rounded to bf16) logits, all in fp32."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText
    base = AutoModelForImageTextToText.from_pretrained(base_dir, dtype=torch.float32)
    base_logits = logits_of(base)
    peft = PeftModel.from_pretrained(base, adapter_dir)
    unmerged = logits_of(peft)
    merged_bf16 = peft.merge_and_unload().to(torch.bfloat16).to(torch.float32)
    return base_logits, unmerged, logits_of(merged_bf16)


def merged_logits(out_dir):
    import torch
    from transformers import AutoModelForImageTextToText
    model = AutoModelForImageTextToText.from_pretrained(out_dir, dtype=torch.bfloat16).to(torch.float32)
    return logits_of(model)


def assert_merge_matches(base_dir, adapter_dir, out_dir, bf16_drift=0.05):
    """The merged model equals base + adapter merged in fp32 and rounded to bf16 (the saved precision). For a dense
    model it also stays within `bf16_drift` of the unmerged fp32 model; for a MoE pass None: rounding the weights
    to bf16 can flip a token's top-k experts, a discontinuity no tolerance on the logits describes."""
    base, unmerged, rounded = reference_logits(base_dir, adapter_dir)
    got = merged_logits(out_dir)
    scale = unmerged.abs().max()
    assert (unmerged - base).abs().max() > 0.05 * scale, \
        'the adapter must change the model for this test to mean anything'
    assert (got - rounded).abs().max() <= 1e-3 * scale + 1e-4, 'merged weights differ from base + adapter'
    if bf16_drift is not None:
        assert (got - unmerged).abs().max() <= bf16_drift * scale, 'merged (bf16) drifts from base + adapter (fp32)'


# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_swift_lora_merges_through_swift_export(cpu_tiny_run, tiny_model_dir, tmp_path):
    assert cpu_tiny_run['rc'] == 0, cpu_tiny_run['log']
    ckpt = tmp_path / 'checkpoint-2'
    shutil.copytree(cpu_tiny_run['checkpoint'], ckpt)
    randomize_lora_b(str(ckpt))
    assert detect_source(str(ckpt))[0] == 'swift'
    out = tmp_path / 'merged'
    proc = run_script(ckpt, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.rindex('{\n'):])
    assert report['source'] == 'swift' and report['architectures'] == ['Qwen3VLForConditionalGeneration']
    assert not [p for p in os.listdir(tmp_path) if p.startswith('.merged.partial-')]  # staging dir cleaned up
    verify_merged(str(out))
    assert_merge_matches(tiny_model_dir, str(ckpt), str(out))
    # a second run refuses to overwrite, and leaves the first result alone
    before = sorted(os.listdir(out))
    proc = run_script(ckpt, out)
    assert proc.returncode == 2 and 'refusing to overwrite' in proc.stderr
    assert sorted(os.listdir(out)) == before


def test_peft_adapter_with_expert_parameters_merges(tiny_moe_model_dir, tmp_path):
    """An adapter of the Unsloth runner's CPU stand-in (LoRA on attention + fused experts) merges with PEFT."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from swift_vora.backends.unsloth import MARKER_FILE
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(tiny_moe_model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=r'.*language_model.*\.(q_proj|v_proj)$',
                                             target_parameters=['mlp.experts.gate_up_proj', 'mlp.experts.down_proj']))
    adapter = tmp_path / 'checkpoint-3'
    model.save_pretrained(adapter)
    (adapter / MARKER_FILE).write_text(json.dumps({'source': 'peft', 'base_model': tiny_moe_model_dir}))
    randomize_lora_b(str(adapter), std=0.2)
    out = tmp_path / 'merged'
    report = merge(str(adapter), str(out))
    assert report['source'] == 'peft' and report['architectures'] == ['Qwen3VLMoeForConditionalGeneration']
    assert 'tokenizer.json' in report['copied_from_base']  # processor files come from the base model
    assert_merge_matches(tiny_moe_model_dir, str(adapter), str(out), bf16_drift=None)
    # its base not a local folder here: the experts' merge cannot be checked, so it is not done (before any work)
    (adapter / MARKER_FILE).write_text(json.dumps({'source': 'peft', 'base_model': 'Org/not-here'}))
    config = json.loads((adapter / 'adapter_config.json').read_text())
    (adapter / 'adapter_config.json').write_text(json.dumps({**config, 'base_model_name_or_path': 'Org/not-here'}))
    with pytest.raises(MergeError) as e:
        merge(str(adapter), str(tmp_path / 'merged-2'))
    assert e.value.exit_code == 2 and 'pass --base MODEL_DIR' in str(e.value) and 'trains the experts' in str(e.value)
    assert not (tmp_path / 'merged-2').exists() and not list(tmp_path.glob('.merged-2.partial-*'))
    # a delta below bf16's resolution: the sampled experts cannot tell a right merge from a scrambled one
    (adapter / MARKER_FILE).write_text(json.dumps({'source': 'peft', 'base_model': tiny_moe_model_dir}))
    (adapter / 'adapter_config.json').write_text(json.dumps(config))
    randomize_lora_b(str(adapter), std=1e-9)
    with pytest.raises(MergeError) as e:
        merge(str(adapter), str(tmp_path / 'merged-3'))
    assert 'cannot tell a right merge from a wrong one' in str(e.value), str(e.value)
    assert not (tmp_path / 'merged-3').exists()


def test_unsloth_adapter_without_unsloth_says_where_to_merge(tmp_path, tiny_moe_model_dir):
    from swift_vora.backends.unsloth import MARKER_FILE
    adapter = tmp_path / 'checkpoint-5'
    adapter.mkdir()
    (adapter / 'adapter_config.json').write_text('{}')
    (adapter / MARKER_FILE).write_text(json.dumps({'source': 'unsloth', 'base_model': tiny_moe_model_dir}))
    with pytest.raises(MergeError, match='GPU'):
        merge(str(adapter), str(tmp_path / 'out'))
    assert not (tmp_path / 'out').exists()
    # with the runner's checkpoint-N-merged (unsloth.save_merged) it is copied and verified
    shutil.copytree(tiny_moe_model_dir, tmp_path / 'checkpoint-5-merged')
    report = merge(str(adapter), str(tmp_path / 'out'))
    assert report['source'] == 'unsloth' and (tmp_path / 'out' / 'model.safetensors').exists()


def test_megatron_checkpoint_uses_its_merged_export(tiny_moe_model_dir, tmp_path):
    """megatron sft --merge_lora true writes checkpoint-N-merged; it is copied (Megatron-only files dropped)."""
    ckpt = tmp_path / 'checkpoint-7'
    ckpt.mkdir()
    megatron_args = {'model': tiny_moe_model_dir, 'expert_model_parallel_size': 8, 'tuner_type': 'lora'}
    (ckpt / 'args.json').write_text(json.dumps(megatron_args))
    (ckpt / 'latest_checkpointed_iteration.txt').write_text('7')
    assert detect_source(str(ckpt))[0] == 'megatron'
    with pytest.raises(MergeError, match='checkpoint-7-merged'):
        merge(str(ckpt), str(tmp_path / 'out'))
    merged = tmp_path / 'checkpoint-7-merged'
    shutil.copytree(tiny_moe_model_dir, merged)
    (merged / 'args.json').write_text(json.dumps(megatron_args))
    (merged / 'latest_checkpointed_iteration.txt').write_text('7')
    (merged / 'iter_0000007').mkdir()
    proc = run_script(ckpt, tmp_path / 'out')
    assert proc.returncode == 0, proc.stderr
    files = os.listdir(tmp_path / 'out')
    assert 'model.safetensors' in files and 'latest_checkpointed_iteration.txt' not in files
    assert 'iter_0000007' not in files
    # the weights are the export's own file (no second copy on the disk); config and tokenizer are copies
    report = json.loads(proc.stdout)
    assert report['weights_linked'] == 1 and report['weights_copied'] == 0
    assert os.path.samefile(tmp_path / 'out' / 'model.safetensors', merged / 'model.safetensors')
    assert not os.path.samefile(tmp_path / 'out' / 'config.json', merged / 'config.json')
    proc = run_script(ckpt, tmp_path / 'copied', '--copy')
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)['weights_copied'] == 1
    assert not os.path.samefile(tmp_path / 'copied' / 'model.safetensors', merged / 'model.safetensors')


def test_weights_are_copied_where_they_cannot_be_linked_and_other_link_errors_stop(tiny_moe_model_dir, tmp_path,
                                                                                   monkeypatch):
    """Another filesystem (EXDEV) or one without hard links: the weight files are copied and the merge goes on;
    an error that a copy would meet too (no permission) stops it, naming the file, with nothing left in OUT_DIR."""
    import errno

    from swift_vora.backends import merge as merge_mod
    ckpt = tmp_path / 'checkpoint-7'
    merged = tmp_path / 'checkpoint-7-merged'
    shutil.copytree(tiny_moe_model_dir, merged)
    args = {'model': tiny_moe_model_dir, 'expert_model_parallel_size': 1, 'tuner_type': 'lora'}
    for folder in (ckpt, merged):
        folder.mkdir(exist_ok=True)
        (folder / 'args.json').write_text(json.dumps(args))

    def link_fails(code):
        def link(src, dst, *a, **k):
            raise OSError(code, os.strerror(code), src)
        return link
    monkeypatch.setattr(merge_mod.os, 'link', link_fails(errno.EXDEV))
    report = merge(str(ckpt), str(tmp_path / 'out'))
    assert report['weights_copied'] == 1 and report['weights_linked'] == 0
    assert not os.path.samefile(tmp_path / 'out' / 'model.safetensors', merged / 'model.safetensors')
    monkeypatch.setattr(merge_mod.os, 'link', link_fails(errno.EACCES))
    with pytest.raises(OSError, match='Permission denied'):
        merge(str(ckpt), str(tmp_path / 'out2'))
    assert not (tmp_path / 'out2').exists() and not [p for p in os.listdir(tmp_path) if '.partial-' in p]


def test_refuses_existing_out_dir_and_bad_input(tmp_path, tiny_model_dir):
    out = tmp_path / 'taken'
    out.mkdir()
    (out / 'keep.txt').write_text('mine')
    proc = run_script(tiny_model_dir, out)
    assert proc.returncode == 2 and 'refusing to overwrite' in proc.stderr
    assert os.listdir(out) == ['keep.txt']
    proc = run_script(tmp_path / 'missing', tmp_path / 'new')
    assert proc.returncode == 2 and not (tmp_path / 'new').exists()
    proc = run_script(tiny_model_dir, tmp_path / 'new')  # a plain model is no adapter
    assert proc.returncode == 2 and 'not an adapter' in proc.stderr
    assert subprocess.run(['bash', SCRIPT], capture_output=True).returncode == 2


# ---------------------------------------------------------------------------------------------------------------
# the checks on a merged directory
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def good_dir(tiny_model_dir, tmp_path):
    path = tmp_path / 'model'
    shutil.copytree(tiny_model_dir, path)
    return path


def _shard(good_dir):
    """Split model.safetensors into two shards with an index (what large models look like)."""
    from safetensors.torch import load_file, save_file
    weights = load_file(str(good_dir / 'model.safetensors'))
    keys = sorted(weights)
    half = len(keys) // 2
    parts = {'model-00001-of-00002.safetensors': keys[:half], 'model-00002-of-00002.safetensors': keys[half:]}
    for name, ks in parts.items():
        save_file({k: weights[k] for k in ks}, str(good_dir / name), metadata={'format': 'pt'})
    os.remove(good_dir / 'model.safetensors')
    index = {'metadata': {}, 'weight_map': {k: name for name, ks in parts.items() for k in ks}}
    (good_dir / 'model.safetensors.index.json').write_text(json.dumps(index))
    return index


def test_a_clean_model_passes(good_dir):
    report = verify_merged(str(good_dir))
    assert report['indexed'] is False and report['files'] == ['model.safetensors']
    _shard(good_dir)
    report = verify_merged(str(good_dir))
    assert report['indexed'] is True and len(report['files']) == 2


def _expect(good_dir, words):
    with pytest.raises(MergeError) as e:
        verify_merged(str(good_dir))
    for w in words:
        assert w in str(e.value), str(e.value)


def test_index_must_be_complete(good_dir):
    _shard(good_dir)
    os.remove(good_dir / 'model-00002-of-00002.safetensors')
    _expect(good_dir, ['do not exist', 'model-00002-of-00002.safetensors'])


def test_every_tensor_must_be_indexed(good_dir):
    index = _shard(good_dir)
    dropped = sorted(index['weight_map'])[0]
    del index['weight_map'][dropped]
    (good_dir / 'model.safetensors.index.json').write_text(json.dumps(index))
    _expect(good_dir, [dropped])


def test_stray_shard_is_reported(good_dir):
    import torch
    from safetensors.torch import save_file
    _shard(good_dir)
    save_file({'x': torch.zeros(2, dtype=torch.bfloat16)}, str(good_dir / 'extra.safetensors'))
    _expect(good_dir, ['not in the index', 'extra.safetensors'])


def test_lora_keys_fp32_architecture_and_tokenizer_are_checked(good_dir):
    import torch
    from safetensors.torch import load_file, save_file
    weights = load_file(str(good_dir / 'model.safetensors'))
    weights['model.language_model.layers.0.self_attn.q_proj.lora_A.weight'] = torch.zeros(2, 2, dtype=torch.bfloat16)
    first = sorted(k for k in weights if 'lora' not in k)[0]
    weights[first] = weights[first].float()
    save_file(weights, str(good_dir / 'model.safetensors'), metadata={'format': 'pt'})
    config = json.loads((good_dir / 'config.json').read_text())
    config['architectures'] = ['MyCustomForCausalLM']
    (good_dir / 'config.json').write_text(json.dumps(config))
    os.remove(good_dir / 'tokenizer.json')
    for name in ('preprocessor_config.json', 'video_preprocessor_config.json', 'processor_config.json'):
        if (good_dir / name).exists():
            os.remove(good_dir / name)
    _expect(good_dir, ['LoRA keys', 'not bf16', 'MyCustomForCausalLM', 'no tokenizer', 'processor files'])


def test_single_file_models_need_no_index_but_several_files_do(good_dir):
    import torch
    from safetensors.torch import save_file
    save_file({'x': torch.zeros(2, dtype=torch.bfloat16)}, str(good_dir / 'other.safetensors'))
    _expect(good_dir, ['no model.safetensors.index.json'])


def test_a_damaged_shard_is_named_and_the_others_checked(good_dir):
    _shard(good_dir)
    (good_dir / 'model-00001-of-00002.safetensors').write_bytes(b'\xff' * 64)  # a header no reader can take
    _expect(good_dir, ['model-00001-of-00002.safetensors: not readable as safetensors'])


def test_verify_only_checks_an_existing_directory_through_the_script(good_dir, tmp_path):
    proc = run_script(tmp_path / 'unused', good_dir, '--verify-only')
    assert proc.returncode == 0, proc.stderr
    (good_dir / 'tokenizer.json').unlink()
    proc = run_script(tmp_path / 'unused', good_dir, '--verify-only')
    assert proc.returncode == 1 and 'no tokenizer' in proc.stderr, proc.stderr
