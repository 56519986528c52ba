"""swift-vora train: recipes, overrides, exit codes, the swift sft / DeepSpeed launch, multi-node env, and the
refusal of every path that could put a MoE model under DeepSpeed ZeRO-3 (all without loading a weight)."""
import json
import os
import subprocess
import sys

import pytest
from cli_harness import launch_folder
from megatron_args import H200X8_AS_MEGATRON_LORA

from swift_vora.backends import LaunchRefused, LaunchUsageError
from swift_vora.backends.deepspeed import ZERO3_SMALL_GPU, ZERO3_SWIFT, zero_config
from swift_vora.backends.launch import build_launch, deepspeed_stage
from swift_vora.backends.planning import plan_recipe
from swift_vora.backends.recipe import SCHEMA, RecipeError, load_recipe, parse_override, recipe_from_dict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, 'tests', 'fixtures', 'configs')
DENSE_2B = os.path.join(CONFIGS, 'qwen3_vl_2b.json')
MOE_35B = os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json')
MOE_30B_VL = os.path.join(CONFIGS, 'qwen3_vl_moe_30b_a3b.json')
SWIFT_PRESETS = os.path.join(os.path.dirname(__import__('swift').__file__), 'config')


@pytest.fixture(scope='module', autouse=True)
def project(tmp_path_factory):
    """The folder `train` runs in: it holds what the shipped recipes name as their data (`data/train.jsonl`, one valid
    annotation line and its video), so that a dry run here exits as on a machine that has the data."""
    global PROJECT
    PROJECT = str(launch_folder(tmp_path_factory.mktemp('project')))
    return PROJECT


PROJECT = REPO


def train(*args, env=None):
    """Run `swift-vora train ...` as a user would, in the project folder; returns (rc, stdout, stderr)."""
    proc = subprocess.run([sys.executable, '-m', 'swift_vora', 'train', *args], cwd=PROJECT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


def dry_json(recipe, *overrides, env=None):
    """`train --dry-run --json`, trusting the recipe's hardware (this machine is not the 3060 or H200 node; a dry run
    compares like the launch: tests/test_hardware_profiles.py)."""
    rc, out, err = train(recipe, *overrides, '--dry-run', '--json', '--trust-recipe-hardware', env=env)
    return rc, (json.loads(out) if out.strip() else None), err


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def minimal(model=DENSE_2B, **train):
    doc = {'hardware': '3060x4', 'model': {'path': model}, 'data': {'dataset': 'data/train.jsonl'}}
    if train:
        doc['train'] = train
    return doc


# ---------------------------------------------------------------------------------------------------------------
# recipes and overrides
# ---------------------------------------------------------------------------------------------------------------
def test_unknown_key_names_file_and_key_with_a_suggestion(tmp_path):
    path = write(tmp_path, 'r.yaml', 'model: {path: x}\ndata: {dataset: d.jsonl}\nvideo: {max_frame: 8}\n')
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert path in str(e.value) and "'video.max_frame'" in str(e.value) and 'video.max_frames' in str(e.value)


@pytest.mark.parametrize('text, key', [
    ('data: {dataset: d.jsonl}\n', "'model.path'"),  # missing required
    ('model: {path: x}\ndata: {dataset: d.jsonl}\nvideo: {max_frames: many}\n', "'video.max_frames'"),
    ('model: {path: x}\ndata: {dataset: d.jsonl}\ntrain: {gradient_checkpointing: 1}\n',
     "'train.gradient_checkpointing'"),
    ('model: {path: x}\ndata: {dataset: d.jsonl}\ntrain: {backend: zero3}\n', "'train.backend'"),
    ('model: x\ndata: {dataset: d.jsonl}\n', "'model'"),
])
def test_recipe_errors_name_the_key(tmp_path, text, key):
    path = write(tmp_path, 'r.yaml', text)
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert path in str(e.value) and key in str(e.value)


def test_bad_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, 'r.yaml', 'model:\n  path: [unclosed\n')
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert path in str(e.value) and 'line' in str(e.value)


def test_overrides_are_dotted_keys_with_yaml_values(tmp_path):
    path = write(tmp_path, 'r.yaml', 'model: {path: x}\ndata: {dataset: d.jsonl}\n')
    r = load_recipe(path, ['video.max_frames=16', 'train.lr=2e-5', 'train.target_modules=[q_proj, v_proj]',
                           'train.max_steps=null', 'env.MY_FLAG=1', 'deepspeed.zero_optimization.overlap_comm=true',
                           'data.dataset=[a.jsonl, b.jsonl]'])
    assert r['video.max_frames'] == 16 and r['train.lr'] == 2e-5 and r['train.max_steps'] is None
    assert r['train.target_modules'] == ['q_proj', 'v_proj'] and r['data.dataset'] == ['a.jsonl', 'b.jsonl']
    assert r['env'] == {'MY_FLAG': 1} and r['deepspeed.zero_optimization'] == {'overlap_comm': True}
    assert parse_override('a.b=') == ('a.b', None)
    for bad in ('video.max_frames', 'video.nope=1', 'video.max_frames=x'):
        with pytest.raises(RecipeError):
            load_recipe(path, [bad])


def test_every_schema_default_passes_its_own_check():
    r = recipe_from_dict({'model': {'path': 'x'}, 'data': {'dataset': 'd'}})
    assert set(r.values) == set(SCHEMA)


# ---------------------------------------------------------------------------------------------------------------
# exit codes of swift-vora train
# ---------------------------------------------------------------------------------------------------------------
def test_exit_codes_usage_does_not_fit_refused(tmp_path):
    rc, _, err = train(write(tmp_path, 'bad.yaml', 'model: {path: x}\n'))
    assert rc == 2 and 'data.dataset' in err
    rc, _, err = train(os.path.join(REPO, 'recipes', '3060x4.yaml'), 'video.max_framez=3')
    assert rc == 2 and 'video.max_frames' in err
    rc, out, err = train(os.path.join(REPO, 'recipes', '3060x4.yaml'), f'model.path={DENSE_2B}', 'train.tuner=full')
    assert rc == 3 and 'does not fit' in err and 'DOES NOT FIT' in out
    rc, out, err = train(os.path.join(REPO, 'recipes', '3060x4.yaml'), f'model.path={MOE_35B}')
    assert rc == 4 and 'zero3-moe' in out
    rc, _, err = train(os.path.join(REPO, 'recipes', '3060x4.yaml'), 'model.path=/nonexistent/model')
    assert rc == 2 and 'model.path' in err


def test_refused_and_does_not_fit_launch_nothing(tmp_path):
    """Without --dry-run a refusal stops before the launcher: nothing is written, no process starts."""
    out_dir = tmp_path / 'out'
    rc, _, _ = train(os.path.join(REPO, 'recipes', '3060x4.yaml'), f'model.path={MOE_35B}',
                     f'train.output_dir={out_dir}')
    assert rc == 4 and not out_dir.exists()
    rc, _, _ = train(os.path.join(REPO, 'recipes', '3060x4.yaml'), f'model.path={DENSE_2B}', 'train.tuner=full',
                     f'train.output_dir={out_dir}')
    assert rc == 3 and not out_dir.exists()


# ---------------------------------------------------------------------------------------------------------------
# DeepSpeed JSON
# ---------------------------------------------------------------------------------------------------------------
def _preset(name):
    with open(os.path.join(SWIFT_PRESETS, name)) as f:
        return json.load(f)


def test_zero3_for_12gb_cards_is_the_field_configuration():
    z = zero_config(3, 'none', 11.76)['zero_optimization']
    assert z['stage'] == 3 and z['overlap_comm'] is False and z['contiguous_gradients'] is True
    assert z['reduce_bucket_size'] == 5e6 and z['stage3_prefetch_bucket_size'] == 5e6
    assert z['stage3_param_persistence_threshold'] == 1e4
    assert z['stage3_max_live_parameters'] == 1e8 and z['stage3_max_reuse_distance'] == 1e8
    assert z['stage3_gather_16bit_weights_on_model_save'] is True
    assert zero_config(3, 'none', 11.76)['bf16'] == {'enabled': 'auto'}


def test_large_gpus_get_ms_swift_presets_verbatim():
    """Above 16 GiB the JSON is ms-swift 4.6's own zero3.json / zero2.json (autos kept)."""
    assert zero_config(3, 'none', 139.8) == _preset('zero3.json')
    assert zero_config(2, 'none', 23.69) == _preset('zero2.json')
    assert ZERO3_SWIFT == _preset('zero3.json')['zero_optimization']
    top_level = {k: v for k, v in _preset('zero3.json').items() if k != 'zero_optimization'}
    assert {k: v for k, v in zero_config(3, 'none', 11.76).items() if k != 'zero_optimization'} == top_level
    assert set(ZERO3_SMALL_GPU) <= set(ZERO3_SWIFT)  # same keys as swift's preset; only values differ


@pytest.mark.parametrize('mem', [11.76, 139.8])
def test_offload_variants_unpinned_small_subgroups(mem):
    z = zero_config(3, 'cpu', mem)['zero_optimization']
    assert z['offload_optimizer'] == {'device': 'cpu', 'pin_memory': False}
    assert z['offload_param'] == {'device': 'cpu', 'pin_memory': False}
    assert z['sub_group_size'] == 1e8
    z2 = zero_config(2, 'cpu', mem)['zero_optimization']
    assert z2['offload_optimizer'] == {'device': 'cpu', 'pin_memory': False} and 'offload_param' not in z2
    # ms-swift's offload preset pins, ours does not: the rest is the same shape
    assert (set(_preset('zero3_offload.json')['zero_optimization'])
            <= set(zero_config(3, 'cpu', mem)['zero_optimization']))


def test_zero_overrides_merge_but_cannot_change_the_stage():
    z = zero_config(3, 'none', 11.76, {'reduce_bucket_size': 1e7, 'offload_param': {'pin_memory': True}})
    assert z['zero_optimization']['reduce_bucket_size'] == 1e7
    assert z['zero_optimization']['offload_param'] == {'device': 'none', 'pin_memory': True}
    rc, _, err = train(os.path.join(REPO, 'recipes', '3060x4.yaml'), f'model.path={DENSE_2B}',
                       'deepspeed.zero_optimization.stage=2')
    assert rc == 2 and 'stage comes from train.backend' in err


@pytest.mark.parametrize('mem, offload', [(11.76, 'none'), (11.76, 'cpu'), (139.8, 'none')])
def test_transformers_integration_fills_every_auto(mem, offload, tmp_path):
    """The HF Trainer's DeepSpeed integration resolves all "auto" values of our JSON (what swift sft uses)."""
    from types import SimpleNamespace

    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
    config = zero_config(3, offload, mem)
    ds = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, gradient_accumulation_steps=4,
                             report_to=[], use_cpu=True)
    ds.trainer_config_process(args)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=2048, hidden_sizes=None))
    ds.trainer_config_finalize(args, model, num_training_steps=10)
    assert 'auto' not in json.dumps(ds.config), ds.config
    assert ds.is_zero3()


def test_deepspeed_validates_the_zero_section():
    import deepspeed  # noqa: F401  (a test dependency: pyproject [test])
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    for mem, offload in ((11.76, 'none'), (11.76, 'cpu'), (139.8, 'cpu')):
        z = zero_config(3, offload, mem)['zero_optimization']
        z = {k: (2048**2 if v == 'auto' else v) for k, v in z.items()}
        parsed = DeepSpeedZeroConfig(**z)
        assert parsed.stage == 3 and parsed.overlap_comm is False


# ---------------------------------------------------------------------------------------------------------------
# the swift sft launch
# ---------------------------------------------------------------------------------------------------------------
def swift_sft_parser():
    from swift.arguments import SftArguments
    from swift.utils.utils import _patch_get_type_hints
    from transformers import HfArgumentParser
    with _patch_get_type_hints():
        return HfArgumentParser([SftArguments])


def test_swift_sft_command_parses_with_ms_swift_arguments():
    rc, d, err = dry_json(os.path.join(REPO, 'recipes', '3060x4.yaml'), f'model.path={DENSE_2B}')
    assert rc == 0, err
    launch = d['launch']
    argv = launch['argv']
    assert os.path.basename(argv[0]) == 'swift' and argv[1] == 'sft'
    ns, unknown = swift_sft_parser().parse_known_args(argv[2:])
    assert unknown == []
    assert ns.custom_register_path == ['swift_vora'] and ns.template == 'video_ora' and ns.model_type == 'qwen3_vl'
    assert ns.dataset == ['data/train.jsonl'] and ns.tuner_type == 'lora' and ns.target_modules == ['all-linear']
    ds_path = ns.deepspeed
    assert ds_path.endswith('deepspeed_zero3.json') and json.loads(launch['files'][ds_path])['zero_optimization'][
        'stage3_max_live_parameters'] == 1e8  # 12 GB cards: the field configuration
    env = launch['env']
    assert env['NPROC_PER_NODE'] == '4' and 'NNODES' not in env
    assert env['SWIFT_VORA_MAX_FRAMES'] == '64' and env['SWIFT_VORA_PAIR_TOKENS'] == '196'
    assert env['SWIFT_VORA_WINDOW'] == '32' and env['SWIFT_VORA_STRIDE'] == '16'
    assert env['HF_HUB_OFFLINE'] == '1' and env['SWIFT_VORA_ENCODE_LOG'].endswith('encode_log.jsonl')
    assert env['SWIFT_VORA_RECIPE'] == os.path.join(REPO, 'recipes', '3060x4.yaml')  # hashed by the fingerprint
    assert d['plan']['command'][0] == 'env' and d['plan']['command'][-len(argv):] == argv


def test_liger_kernel_is_opt_in_and_reaches_swift_sft():
    rc, d, err = dry_json(os.path.join(REPO, 'recipes', '3060x4.yaml'), f'model.path={DENSE_2B}')
    assert rc == 0, err
    assert '--use_liger_kernel' not in d['launch']['argv']  # liger-kernel is not a dependency: off by default
    rc, d, err = dry_json(os.path.join(REPO, 'recipes', '3060x4.yaml'), f'model.path={DENSE_2B}',
                          'train.liger_kernel=true')
    assert rc == 0, err
    ns, unknown = swift_sft_parser().parse_known_args(d['launch']['argv'][2:])
    assert unknown == [] and ns.use_liger_kernel is True


def test_compile_is_opt_in_reaches_the_plugin_and_says_where_it_does_not_apply():
    recipe = os.path.join(REPO, 'recipes', '3090x3.yaml')
    rc, d, err = dry_json(recipe, f'model.path={DENSE_2B}', env={'PYTORCH_CUDA_ALLOC_CONF': ''})
    assert rc == 0, err
    assert 'SWIFT_VORA_COMPILE' not in d['launch']['env']
    assert d['launch']['env']['PYTORCH_CUDA_ALLOC_CONF'] == 'expandable_segments:True'
    # the compiled path of the benchmark: no DeepSpeed, the layers compiled by the plugin
    rc, d, err = dry_json(recipe, f'model.path={DENSE_2B}', 'train.backend=ddp', 'train.compile=layers')
    assert rc == 0, err
    assert d['launch']['env']['SWIFT_VORA_COMPILE'] == 'layers'
    assert not any('train.compile' in n for n in d['launch']['notes'])
    # under ZeRO-3 (the planner's dense choice here) and next to Liger the user is told, and where it was measured
    rc, d, err = dry_json(recipe, f'model.path={DENSE_2B}', 'train.backend=deepspeed_zero3', 'train.compile=layers',
                          'train.liger_kernel=true')
    assert rc == 0, err
    notes = ' '.join(d['launch']['notes'])
    assert 'not applied under DeepSpeed' in notes and 'measured slower' in notes and 'docs/benchmarks.md' in notes
    with open(os.path.join(REPO, 'docs', 'benchmarks.md'), encoding='utf-8') as f:  # the page the note sends to
        assert any('Liger' in line and 'compiled layers' in line for line in f), 'docs/benchmarks.md: no Liger figure'
    rc, _, err = dry_json(recipe, f'model.path={DENSE_2B}', 'train.compile=everything')
    assert rc != 0 and "'train.compile'" in err and 'off, layers' in err


def test_packing_runs_sdpa_recipes_as_vora_varlen_and_refuses_an_attention_that_would_mix_samples():
    recipe = os.path.join(REPO, 'recipes', '3090x3.yaml')
    rc, d, err = dry_json(recipe, f'model.path={DENSE_2B}')
    assert rc == 0, err
    argv = d['launch']['argv']
    assert argv[argv.index('--attn_impl') + 1] == 'sdpa' and '--padding_free' not in argv
    for packing, flag in (('micro_batch', '--padding_free'), ('dataset', '--packing')):
        rc, d, err = dry_json(recipe, f'model.path={DENSE_2B}', f'train.packing={packing}', 'data.max_length=20000')
        assert rc == 0, err
        argv = d['launch']['argv']
        assert argv[argv.index('--attn_impl') + 1] == 'vora_varlen' and argv[argv.index(flag) + 1] == 'true'
    rc, d, err = dry_json(recipe, f'model.path={DENSE_2B}', 'train.packing=micro_batch', 'train.attn_impl=flash_attn')
    assert rc == 0, err
    assert d['launch']['argv'][d['launch']['argv'].index('--attn_impl') + 1] == 'flash_attn'
    rc, _, err = dry_json(recipe, f'model.path={DENSE_2B}', 'train.packing=micro_batch', 'train.attn_impl=eager')
    assert rc != 0 and 'train.packing=micro_batch' in err and "train.attn_impl='eager'" in err
    rc, _, err = dry_json(recipe, f'model.path={DENSE_2B}', 'swift_args.padding_free=true')
    assert rc != 0 and 'train.packing' in err
    # dataset packing fills rows up to data.max_length: without it ms-swift would pack up to the whole context
    rc, _, err = dry_json(recipe, f'model.path={DENSE_2B}', 'train.packing=dataset', 'data.max_length=null')
    assert rc != 0 and 'data.max_length is not set' in err
    # ... and the plan is made for the full row
    rc, d, err = dry_json(recipe, f'model.path={DENSE_2B}', 'train.packing=dataset', 'data.max_length=20000')
    assert rc == 0, err
    assert any('each row holds up to 20000 tokens' in a for a in d['plan']['assumptions'])


def test_a_user_allocator_setting_is_kept():
    rc, d, err = dry_json(os.path.join(REPO, 'recipes', '3090x3.yaml'), f'model.path={DENSE_2B}',
                          env={'PYTORCH_CUDA_ALLOC_CONF': 'max_split_size_mb:128'})
    assert rc == 0, err
    assert 'PYTORCH_CUDA_ALLOC_CONF' not in d['launch']['env']  # inherited from the user's environment as set


def test_every_backend_launches_with_expandable_segments_unless_the_user_or_recipe_says_otherwise():
    """The Unsloth and Megatron launches grow CUDA segments as the swift sft one does: the plan counts the
    expandable allocator's fragmentation for the Unsloth path (plan/memory.py), measured with it."""
    moe = os.path.join(CONFIGS, 'qwen3_5_moe_35b_a3b.json')
    for recipe, extra, backend in (('h200x1.yaml', [], 'unsloth_split_lora'), ('h200x8.yaml', [], 'unsloth_split_lora'),
                                   ('h200x8.yaml', H200X8_AS_MEGATRON_LORA, 'megatron_ep_lora')):
        path = os.path.join(REPO, 'recipes', recipe)
        rc, d, err = dry_json(path, f'model.path={moe}', *extra, env={'PYTORCH_CUDA_ALLOC_CONF': ''})
        assert rc == 0, err
        assert d['plan']['backend'] == backend
        assert d['launch']['env']['PYTORCH_CUDA_ALLOC_CONF'] == 'expandable_segments:True'
        rc, d, err = dry_json(path, f'model.path={moe}', *extra, 'env.PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64',
                              env={'PYTORCH_CUDA_ALLOC_CONF': ''})
        assert rc == 0, err
        assert d['launch']['env']['PYTORCH_CUDA_ALLOC_CONF'] == 'max_split_size_mb:64'


def test_budget_env_round_trips_to_the_template_budget():
    from swift_vora.budget import VideoBudget
    rc, d, _ = dry_json(os.path.join(REPO, 'recipes', '3090x3.yaml'), f'model.path={DENSE_2B}', 'video.max_frames=20',
                        'video.max_video_tokens=1000')
    assert rc == 0
    budget = VideoBudget.from_env(d['launch']['env'])
    assert budget == VideoBudget(fps=2.0, min_frames=4, max_frames=20, pair_tokens=196, min_pair_tokens=16,
                                 max_video_tokens=1000)


def test_two_nodes_use_torchrun_rendezvous_env(tmp_path):
    recipe = os.path.join(REPO, 'recipes', '3060x4.yaml')
    rc, d, _ = dry_json(recipe, f'model.path={DENSE_2B}', 'nodes=2',
                        env={'NODE_RANK': '1', 'MASTER_ADDR': '10.1.2.3', 'MASTER_PORT': '29511'})
    assert rc == 0
    env = d['launch']['env']
    assert (env['NNODES'], env['NODE_RANK'], env['MASTER_ADDR'], env['MASTER_PORT'], env['NPROC_PER_NODE']) == (
        '2', '1', '10.1.2.3', '29511', '4')
    # without the rendezvous variables the dry run shows shell expansions that fail loudly, and a real launch stops
    env_clean = {k: '' for k in ('NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT')}
    rc, d, _ = dry_json(recipe, f'model.path={DENSE_2B}', 'nodes=2', env=env_clean)
    assert rc == 2 and d['launch']['env']['NODE_RANK'].startswith('${NODE_RANK:?')  # the exit code of the launch
    assert any('NODE_RANK' in problem for problem in d['not_launched']) and d['exit_code'] == 2
    assert '"${MASTER_ADDR:?set MASTER_ADDR on every node}"' in d['launch']['shell']
    rc, _, err = train(recipe, f'model.path={DENSE_2B}', 'nodes=2', f'train.output_dir={tmp_path / "o"}',
                       'hardware_check=false', env=env_clean)  # this machine is not the 3060 node: trust the recipe
    assert rc == 2 and 'NODE_RANK' in err and not (tmp_path / 'o').exists()


def test_extra_args_cannot_switch_the_backend():
    recipe = recipe_from_dict(dict(minimal(), extra_args=['--tuner_backend', 'unsloth']))
    with pytest.raises(LaunchUsageError):
        build_launch(plan_recipe(recipe), recipe)
    recipe = recipe_from_dict(dict(minimal(), extra_args=['--save_total_limit', '2']))
    assert build_launch(plan_recipe(recipe), recipe).argv[-2:] == ['--save_total_limit', '2']


def test_extra_args_cannot_change_the_loss_the_megatron_plan_counted():
    recipe = recipe_from_dict(dict(minimal(MOE_35B, backend='megatron_ep_lora'), hardware='h200x8',
                                   extra_args=['--cross_entropy_fusion_impl', 'te']))
    with pytest.raises(LaunchUsageError, match='cross_entropy_fusion_impl'):
        build_launch(plan_recipe(recipe), recipe)


def test_checkpoint_layers_reaches_the_training_process_and_is_refused_where_it_means_nothing():
    # swift sft (ZeRO-3 here) and the Unsloth runner read SWIFT_VORA_CHECKPOINT_LAYERS (speed/partial_checkpoint.py)
    recipe = recipe_from_dict(minimal(checkpoint_layers=20))
    assert build_launch(plan_recipe(recipe), recipe).env['SWIFT_VORA_CHECKPOINT_LAYERS'] == '20'
    assert 'SWIFT_VORA_CHECKPOINT_LAYERS' not in build_launch(plan_recipe(recipe_from_dict(minimal())),
                                                              recipe_from_dict(minimal())).env
    moe = recipe_from_dict(dict(minimal(MOE_35B, checkpoint_layers=30), hardware='h200x1'))
    assert build_launch(plan_recipe(moe), moe).env['SWIFT_VORA_CHECKPOINT_LAYERS'] == '30'
    megatron = recipe_from_dict(dict(minimal(MOE_35B, checkpoint_layers=4, backend='megatron_ep_lora'),
                                     hardware='h200x8'))
    with pytest.raises(LaunchUsageError, match='megatron.recompute'):
        build_launch(plan_recipe(megatron), megatron)
    with pytest.raises(RecipeError, match='gradient_checkpointing is false'):
        recipe_from_dict(minimal(checkpoint_layers=4, gradient_checkpointing=False))
    with pytest.raises(RecipeError, match="'train.checkpoint_layers' must be >= 0"):
        recipe_from_dict(minimal(checkpoint_layers=-1))


def test_checkpoint_layers_auto_launches_the_fewest_layers_the_plan_fits():
    """train.checkpoint_layers=auto: the plan picks the fewest checkpointed layers whose plan still fits (each one
    not checkpointed is a forward the backward does not recompute), says so, and the launch checkpoints that many;
    one layer fewer would not fit. Where every layer stays checkpointed the launch sets nothing."""
    from dataclasses import replace

    from swift_vora.backends.planning import plan_request
    from swift_vora.plan.select import make_plan

    moe = recipe_from_dict(dict(minimal(MOE_35B, checkpoint_layers='auto', micro_batch=4), hardware='h200x1'))
    plan = plan_recipe(moe)
    k = plan.checkpoint_layers
    assert plan.verdict == 'fits' and 0 < k < 40, plan.reasons
    assert build_launch(plan, moe).env['SWIFT_VORA_CHECKPOINT_LAYERS'] == str(k)
    assert any(r.startswith(f'train.checkpoint_layers=auto: the first {k} of 40') for r in plan.reasons)
    # 'gpu': the plan's place for them; nothing else searched (one layer fewer must not fit at this budget)
    request = replace(plan_request(moe), checkpoints=plan.checkpoints, search=())
    assert plan.checkpoints == 'gpu'
    assert make_plan(replace(request, checkpoint_layers=k)).verdict == 'fits'
    assert make_plan(replace(request, checkpoint_layers=k - 1), search_alternatives=False).verdict == 'does_not_fit'
    # checkpoints offloaded to host RAM (the GPU is short): every layer stays checkpointed, and no variable
    offloaded = recipe_from_dict(dict(minimal(MOE_35B, checkpoint_layers='auto', micro_batch=4), hardware='h200x1',
                                      unsloth={'gradient_checkpointing': 'unsloth'}))
    offloaded_plan = plan_recipe(offloaded)
    assert offloaded_plan.checkpoints == 'host' and offloaded_plan.checkpoint_layers is None
    assert 'SWIFT_VORA_CHECKPOINT_LAYERS' not in build_launch(offloaded_plan, offloaded).env
    assert any('every one of the 40 decoder layers checkpointed (the layer checkpoints go to host RAM' in r
               for r in offloaded_plan.reasons)
    # Megatron recomputes by its own settings: auto is not refused there, it leaves them alone
    megatron = recipe_from_dict(dict(minimal(MOE_35B, checkpoint_layers='auto', backend='megatron_ep_lora'),
                                     hardware='h200x8'))
    assert 'SWIFT_VORA_CHECKPOINT_LAYERS' not in build_launch(plan_recipe(megatron), megatron).env
    with pytest.raises(RecipeError, match="'train.checkpoint_layers' must be a number of layers or auto"):
        recipe_from_dict(minimal(checkpoint_layers='some'))
    with pytest.raises(RecipeError, match='gradient_checkpointing is false'):
        recipe_from_dict(minimal(checkpoint_layers='auto', gradient_checkpointing=False))


def test_recipe_env_cannot_override_the_budget():
    with pytest.raises(RecipeError, match="key 'env.SWIFT_VORA_MAX_FRAMES': set by swift-vora train from the recipe "
                                          "key 'video.max_frames'"):
        recipe_from_dict(dict(minimal(), env={'SWIFT_VORA_MAX_FRAMES': '512'}))


# ---------------------------------------------------------------------------------------------------------------
# MoE + ZeRO-3: refused on every path (exit 4)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('recipe, overrides', [
    ('3060x4', []),  # the recipe's deepspeed_zero3 with a MoE model
    ('3090x3', []),
    ('h200x1', ['train.backend=deepspeed_zero3']),
    ('h200x8', ['train.backend=deepspeed_zero3']),
    ('h200x8', ['train.backend=deepspeed_zero3', 'deepspeed.offload=cpu']),
    ('h200x1', ['train.backend=ddp', 'extra_args=[--deepspeed, zero3]']),
    ('h200x1', ['train.backend=ddp', 'extra_args=[--deepspeed=zero3_offload]']),
    ('h200x1', ['train.backend=ddp', 'extra_args=[--deepspeed, \'{"zero_optimization": {"stage": 3}}\']']),
    ('h200x1', ['train.backend=deepspeed_zero2', 'deepspeed.zero_optimization.stage=3']),
    ('h200x8', [*H200X8_AS_MEGATRON_LORA, 'extra_args=[--deepspeed, zero3]']),
])
@pytest.mark.parametrize('model', [MOE_35B, MOE_30B_VL])
def test_moe_with_zero3_is_refused_everywhere(recipe, overrides, model):
    rc, d, err = dry_json(os.path.join(REPO, 'recipes', f'{recipe}.yaml'), f'model.path={model}', 'model.type=null',
                          *overrides)
    assert rc == 4, (rc, err)
    assert d['plan']['verdict'] == 'refused' and 'launch' not in d and d['plan']['command'] == []


def test_moe_zero3_guard_reads_json_files(tmp_path):
    cfg = tmp_path / 'ds.json'
    cfg.write_text(json.dumps({'zero_optimization': {'stage': 3}}))
    assert deepspeed_stage(str(cfg), {}) == 3
    assert deepspeed_stage('zero3_offload', {}) == 3 and deepspeed_stage('zero2', {}) == 2
    rc, d, _ = dry_json(os.path.join(REPO, 'recipes', 'h200x1.yaml'), f'model.path={MOE_35B}', 'train.backend=ddp',
                        f'extra_args=[--deepspeed, {cfg}]')
    assert rc == 4
    # the guard itself, independent of the planner: a plan that says "fits" is still refused
    from dataclasses import replace

    from swift_vora.plan.backend import Backend
    planned = plan_recipe(recipe_from_dict(dict(minimal(MOE_35B, backend='ddp'))))
    says_fits = replace(planned, backend=Backend.DEEPSPEED_ZERO3, verdict='fits')
    with pytest.raises(LaunchRefused):
        build_launch(says_fits, recipe_from_dict(dict(minimal(MOE_35B, backend='deepspeed_zero3'))))


def test_dense_zero3_and_moe_zero2_are_not_refused():
    rc, d, _ = dry_json(os.path.join(REPO, 'recipes', '3060x4.yaml'), f'model.path={DENSE_2B}')
    assert rc == 0 and d['launch']['backend'] == 'deepspeed_zero3'
    rc, d, err = dry_json(os.path.join(REPO, 'recipes', 'h200x1.yaml'), f'model.path={MOE_35B}',
                          'train.backend=deepspeed_zero2', 'train.tuner=full', 'deepspeed.offload=cpu')
    assert rc in (0, 3), err  # ZeRO-2 is allowed for MoE (it may not fit)
    assert d['plan']['verdict'] != 'refused'


def test_recipe_guards_env_sets_switches_checked_by_the_table():
    # what docs/guards.md documents: a guard's switch in the recipe's guards.env reaches the launched process
    recipe = recipe_from_dict(dict(minimal(), guards={'env': {'SWIFT_VORA_TAIL': 'drop'}},
                                   env={'SWIFT_VORA_HOST_OVERHEAD': 0}))
    env = build_launch(plan_recipe(recipe), recipe).env
    assert env['SWIFT_VORA_TAIL'] == 'drop' and env['SWIFT_VORA_HOST_OVERHEAD'] == '0'
    for bad, message in [({'SWIFT_VORA_TAIL': 'dorp'}, "SWIFT_VORA_TAIL='dorp': expected one of pad, drop, stop"),
                         ({'SWIFT_VORA_HOST_OVERHEAD': 'flase'}, "SWIFT_VORA_HOST_OVERHEAD='flase'"),
                         ({'SWIFT_VORA_TAIIL': 'pad'}, 'not a swift-vora switch .did you mean SWIFT_VORA_TAIL'),
                         ({'SWIFT_VORA_COMPILE': 'layers'}, "recipe key 'train.compile'")]:
        with pytest.raises(RecipeError, match=message):  # where the recipe is read, before any plan or launch
            recipe_from_dict(dict(minimal(), guards={'env': bad}))


@pytest.mark.parametrize('doc, flag, expected', [
    (minimal(tuner='lora'), '--learning_rate', '0.0001'),  # swift sft, LoRA: ms-swift's 1e-4
    ({**minimal(tuner='full', backend='deepspeed_zero3'), 'hardware': 'h200x8'}, '--learning_rate', '1e-05'),
    ({**minimal(MOE_35B, tuner='full'), 'hardware': 'h200x8'}, '--lr', '1e-05'),  # megatron sft, full SFT
    ({**minimal(MOE_35B, tuner='lora', backend='megatron_ep_lora', micro_batch=2), 'hardware': 'h200x8',
      'megatron': {'ep': 8}}, '--lr', '0.0001'),
    ({**minimal(MOE_35B, tuner='full', lr=3e-6), 'hardware': 'h200x8'}, '--lr', '3e-06'),  # the user's value wins
])
def test_a_recipe_without_a_learning_rate_gets_ms_swifts_default_for_its_tuner(doc, flag, expected):
    """Full SFT at LoRA's 1e-4 would move a 35B model's weights ten times further a step than ms-swift's own default
    for full training (1e-5): a recipe that sets no learning rate gets what `swift sft` / `megatron sft` would."""
    recipe = recipe_from_dict(doc)
    argv = build_launch(plan_recipe(recipe), recipe).argv
    assert argv[argv.index(flag) + 1] == expected
    if flag == '--lr':
        assert argv[argv.index('--min_lr') + 1] == f'{float(expected) / 10:g}'
