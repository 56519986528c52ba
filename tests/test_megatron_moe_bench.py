"""benchmarks/megatron_moe.py on CPU: the Megatron variants' launches (built by swift-vora from recipes/h200x8.yaml
with the one-GPU overrides, parsed with Megatron-SWIFT's own argument class), the per-step times recovered from
Megatron-SWIFT's logging.jsonl, and the result file's keys.

Why no end-to-end CPU run: `megatron sft` needs transformer_engine (CUDA only) to build any model, and the MoE
router/dispatcher call torch.cuda in forward (shared/notes/megatron-te.md), so the launch is checked up to its argv
and the measurement code on records in Megatron-SWIFT's format; the GPU phase runs the rest."""
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
sys.path.insert(0, os.path.join(REPO, 'tests'))
import megatron_moe as mm  # noqa: E402
import moe_throughput as mt  # noqa: E402

CONFIG = os.path.join(REPO, 'tests', 'fixtures', 'configs', 'qwen3_5_moe_35b_a3b.json')


@pytest.fixture(scope='module')
def launches(tmp_path_factory):
    from swift_vora.backends.launch import build_launch
    from swift_vora.backends.planning import plan_recipe
    from swift_vora.backends.recipe import load_recipe
    args = mm.parse_args([])
    model = mm.cut_config(CONFIG, args.layers, str(tmp_path_factory.mktemp('cfg')))
    before = set(sys.modules)
    found = {}
    for name in mm.MEGATRON_LEVERS:
        if name == 'mg_mb4':  # the planner says 8 layers at micro-batch 4 do not fit one H200 (its own check)
            continue
        recipe = load_recipe(mm.RECIPE, mm.megatron_overrides(name, args, mt.budget(False), model, 'data/train.jsonl',
                                                              f'/tmp/{name}', name == mm.FLAGSHIP))
        plan = plan_recipe(recipe)
        assert plan.verdict == 'fits', (name, plan.reasons)
        found[name] = build_launch(plan, recipe, environ={})
    yield found
    # Planning a Megatron recipe may import Megatron-SWIFT's argument parser, whose import fails here without
    # transformer_engine but leaves the lazy `swift.megatron` package in sys.modules: later tests would take this
    # process for a `megatron sft` one (swift_registry.register_megatron_callbacks)
    for name in set(sys.modules) - before:
        if name.startswith(('swift.megatron', 'megatron', 'mcore_bridge')):
            sys.modules.pop(name, None)


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_every_lever_reaches_megatron_sft(launches):
    base = launches['mg_base'].argv
    assert flag(base, '--expert_model_parallel_size') == '1' and flag(base, '--global_batch_size') == '4'
    assert flag(base, '--recompute_granularity') == 'full' and flag(base, '--merge_lora') == 'false'
    assert flag(launches[mm.FLAGSHIP].argv, '--merge_lora') == 'true'  # item 1's run writes the merged copy
    assert flag(base, '--train_iters') == '12' and flag(base, '--logging_steps') == '1'
    env = launches['mg_base'].env
    assert env['NPROC_PER_NODE'] == '1' and env['SWIFT_VORA_MEGATRON_FLA'] == 'auto'
    assert flag(launches['mg_te_ce'].argv, '--cross_entropy_fusion_impl') == 'te'
    # the memory fit's shorter samples: half the frames reach the template's budget, alone and with TE's loss
    assert env['SWIFT_VORA_MAX_FRAMES'] == '64' and launches['mg_f32'].env['SWIFT_VORA_MAX_FRAMES'] == '32'
    assert flag(launches['mg_f32_te_ce'].argv, '--cross_entropy_fusion_impl') == 'te'
    assert flag(launches['mg_te_ce'].argv, '--merge_lora') == 'false'  # only the flagship writes a merged copy
    assert flag(launches['mg_selective'].argv, '--recompute_granularity') == 'selective'
    assert flag(launches['mg_norecompute'].argv, '--recompute_granularity') == 'none'
    assert flag(launches['mg_no_grouped_gemm'].argv, '--moe_grouped_gemm') == 'false'
    assert flag(launches['mg_no_permute_fusion'].argv, '--moe_permute_fusion') == 'false'
    assert flag(launches['mg_mb2'].argv, '--micro_batch_size') == '2'


def test_each_variant_trains_at_the_micro_batch_its_name_says_whatever_the_recipe_ships(launches):
    """Call g's recipe change (micro-batch 1 -> 2) would have turned mg_base into mg_mb2 and every lever measured at
    micro-batch 1 into its micro-batch-2 twin, under the same names as their calibration rows and predictions."""
    for name, launch in launches.items():
        micro = next((o.split('=')[1] for o in mm.MEGATRON_LEVERS[name] if o.startswith('train.micro_batch=')), '1')
        assert flag(launch.argv, '--micro_batch_size') == micro, name
    assert flag(launches['mg_mb2_norecompute'].argv, '--recompute_granularity') == 'none'
    assert launches['mg_mb2_eager'].env.get('TORCHDYNAMO_DISABLE') == '1'  # the recipe's env reaches megatron sft
    assert 'TORCHDYNAMO_DISABLE' not in launches[mm.FLAGSHIP].env


def test_the_checked_run_trains_the_megatron_settings_the_h200x8_recipe_ships():
    """The checked run is `swift-vora train recipes/h200x8.yaml` overridden to one GPU and to Megatron's LoRA by name
    (the recipe itself trains Unsloth replicas on eight H200s), with every Megatron setting the recipe ships: the
    benchmark turns the recipe's levers off for every variant (BASE_SETTINGS) and the flagship's levers must turn
    each back to the recipe's value, at the recipe's micro-batch. A lever the recipe starts shipping without the
    flagship naming it fails here, not as a checked run of an old setting on a GPU."""
    import yaml
    with open(mm.RECIPE) as f:
        recipe = yaml.safe_load(f)
    effective = dict(o.split('=', 1) for o in [*mm.BASE_SETTINGS, *mm.MEGATRON_LEVERS[mm.FLAGSHIP]])  # later wins

    def shipped(key):
        section, name = key.split('.', 1)
        value = recipe[section][name]
        return str(value).lower() if isinstance(value, bool) else str(value)

    for key in dict(o.split('=', 1) for o in mm.BASE_SETTINGS):
        assert effective[key] == shipped(key), (key, effective[key], shipped(key))
    for key in (f'env.{name}' for name in recipe['env']):  # the recipe's own switches, named by the flagship
        assert effective.get(key) == shipped(key), (key, effective.get(key), shipped(key))
    assert effective['train.micro_batch'] == str(recipe['train']['per_device_train_batch_size'])
    args = mm.parse_args([])
    overrides = mm.megatron_overrides(mm.FLAGSHIP, args, mm.mt.budget(False), '/m', 'a.jsonl', '/o', flagship=True)
    assert 'train.backend=megatron_ep_lora' in overrides and 'train.checkpoint_layers=null' in overrides
    assert overrides.index(mm.BASE_SETTINGS[0]) < overrides.index(mm.MEGATRON_LEVERS[mm.FLAGSHIP][-1])


def test_the_checked_run_writes_the_merged_copy_at_the_recipes_settings(launches):
    flagship = launches[mm.FLAGSHIP]
    assert flag(flagship.argv, '--merge_lora') == 'true' and flag(flagship.argv, '--micro_batch_size') == '4'
    assert flag(flagship.argv, '--cross_entropy_fusion_impl') == 'te'
    assert flagship.env['SWIFT_VORA_MEGATRON_OPTIMIZER'] == 'coalesced'
    assert flagship.env['SWIFT_VORA_MEGATRON_EXPERT_LORA'] == 'grouped_mm'
    twin = launches['mg_mb4_te_ce_gmm_pao_glora']
    assert flag(twin.argv, '--merge_lora') == 'false' and twin.env['SWIFT_VORA_MEGATRON_OPTIMIZER'] == 'per_tensor'


def test_the_argvs_parse_with_megatron_swift(launches):
    import importlib.util
    for name in ('megatron', 'mcore_bridge'):  # found, not imported (mcore_bridge imports transformer_engine): a
        assert importlib.util.find_spec(name) is not None, name  # test dependency, checked in a subprocess below
    from megatron_args import validate_argv
    parsed = dict(zip(launches, validate_argv([launch.argv[2:] for launch in launches.values()])))
    assert parsed['mg_mb2_cutlass_nofusion']['values']['gradient_accumulation_fusion'] is False


def test_default_variants_are_known():
    for name in mm.DEFAULT_VARIANTS.split(','):
        assert name in mm.MEGATRON_LEVERS or name in ('vora_unsloth_best', 'swift_peft'), name
    assert mm.FLAGSHIP in mm.DEFAULT_VARIANTS.split(',')


def megatron_records(step_s, n=12):
    """logging.jsonl lines as Megatron-SWIFT writes them: train_speed(s/it) is the running mean since step 1."""
    ends, total = [], 0.0
    for s in step_s:
        total += s
        ends.append(total)
    return [{'loss': 10.0 - k * 0.1, 'iteration': f'{k}/{n}', 'memory(GiB)': 50.0 + k * 0.1,
             'train_speed(s/it)': round(ends[k - 1] / k, 6)} for k in range(1, n + 1)]


def test_step_times_from_the_running_mean():
    steps = [30.0, 2.0] + [1.0, 1.2, 0.9, 1.1, 5.0, 1.0, 1.0, 0.95, 1.05, 1.0]
    stats = mm.megatron_step_stats(megatron_records(steps), tokens_per_sample=8000, global_batch=4, warmup=2)
    assert stats['step_s'] == pytest.approx(steps[2:], abs=1e-3)
    assert stats['median_step_s'] == pytest.approx(1.0, abs=1e-3) and stats['first_step_s'] == 30.0
    assert stats['tokens_per_s'] == pytest.approx(32000, rel=1e-3)  # 4 samples x 8000 tokens / the median step
    with pytest.raises(SystemExit, match='every step'):
        mm.megatron_step_stats(megatron_records(steps)[::2], 8000, 4, 2)  # logging_steps > 1: cannot be split


def test_result_file_keys_and_backend_ratio():
    report = {k: None for k in mm.REPORT_KEYS} | {'failures': [], 'backend': 'megatron_ep_lora', 'merged_loads': True}
    payload = {'date': '2026-12-03', 'variants': {
        mm.FLAGSHIP: {'tokens_per_s': 9000.0, 'median_step_s': 3.6, 'peak_reserved_gib': 60.0, 'planned_peak_gib': 63.0,
                    'plan_error': -0.02, 'report': report,
                    'guard_files': {'fingerprint': 'v0/fingerprint.json', 'memory': 'v0/memory_phases.rank0.jsonl',
                                    'lora_update': 'v0/lora_update.json'}},
        'mg_te_ce': {'tokens_per_s': 10000.0, 'median_step_s': 3.2, 'peak_reserved_gib': 40.0},
        'vora_unsloth_best': {'tokens_per_s': 12500.0, 'median_step_s': 2.6, 'peak_reserved_gib': 45.0},
        'swift_peft': {'failed': 'out of time'}}}
    final = mm.assemble(payload)
    assert set(mm.REPORT_KEYS) <= set(final) and final['tokens_per_s'] == 9000.0 and final['failures'] == []
    for result in final['variants'].values():
        assert set(mm.VARIANT_KEYS) <= set(result)
    ratio = final['backend_ratio']
    assert ratio['megatron_variant'] == 'mg_te_ce' and ratio['megatron_over_unsloth'] == 0.8
    silent = json.loads(json.dumps(payload))
    silent['variants'][mm.FLAGSHIP]['guard_files']['lora_update'] = None
    assert mm.assemble(silent)['failures'] == ['guards lora_update wrote no report under megatron sft']
    no_flagship = mm.assemble({'variants': {mm.FLAGSHIP: {'failed': 'TE import failed'}}})
    assert 'TE import failed' in no_flagship['failures'][0] and no_flagship['backend_ratio'] is None


def test_no_flagship_run_is_not_a_failure_and_still_gives_the_backend_ratio():
    # The 2026-12-02 call b shape: --no-flagship, the flagship measured without its item-1 report, Unsloth measured.
    payload = {'variants': {
        mm.FLAGSHIP: {'tokens_per_s': 4483.2, 'median_step_s': 6.949, 'peak_reserved_gib': 38.62},
        'vora_unsloth_best': {'tokens_per_s': 29726.8, 'median_step_s': 1.048, 'peak_reserved_gib': 30.164},
        'mg_te_ce': {'skipped': 'deadline 520 s passed'}}}
    final = mm.assemble({**json.loads(json.dumps(payload)), 'flagship_asked': False})
    assert not final['failures'] and 'not asked' in final['flagship']
    assert final['backend_ratio']['megatron_over_unsloth'] == pytest.approx(0.151, abs=1e-3)
    assert mm.assemble(json.loads(json.dumps(payload)))['failures']  # asked for and missing: still a failure
    failed = {'variants': {mm.FLAGSHIP: {'failed': 'out of memory'}}, 'flagship_asked': False}
    assert 'out of memory' in mm.assemble(failed)['failures'][0]
    # a memory call of other variants (memory calls d-f): the flagship neither asked for nor run is no failure
    memory_call = mm.assemble({'variants': {'mg_f32': {'peak_reserved_gib': 28.82}}, 'flagship_asked': False})
    assert not memory_call.get('failures') and 'not among the variants' in memory_call['flagship']
    assert mm.assemble({'variants': {'mg_f32': {'peak_reserved_gib': 28.82}}})['failures']  # asked: still missing


def test_a_slow_megatron_variant_gets_a_stack_dump_once_training_began(tmp_path):
    import subprocess
    assert mm.parse_args(['--megatron-spy-after', '150']).megatron_spy_after == 150
    assert mm.parse_args([]).megatron_spy_after is None
    log = tmp_path / 'train.log'
    log.write_text('loading...\n')
    # a stand-in for megatron sft: loads for a second, starts training, then stays in its first step
    proc = subprocess.Popen(['sh', '-c', f'sleep 1; echo "{mm.MEGATRON_TRAIN_MARK}   0%|" >> {log}; sleep 30'],
                            start_new_session=True)
    try:
        dump = tmp_path / 'py-spy-dump.txt'
        mm.mt.spy_when_slow(proc, 0.5, str(dump), str(log), mm.MEGATRON_TRAIN_MARK)
        assert dump.exists() and dump.read_text()  # the stacks, or why py-spy could not be run
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_variants_kept_folder_is_summarized_as_a_run_would_be(tmp_path, capsys):
    """`--summarize-logs`: a variant killed by its timeout after its steps were logged (call f's mg_f32) keeps its
    folder in the phase's log archive; the summary a run writes is made from it (peak, plan error, step times)."""
    vdir = tmp_path / 'mg_f32'
    run = vdir / 'output' / 'v0-20261204-030410'
    run.mkdir(parents=True)
    plan = {'plan': {'backend': 'megatron_ep_lora', 'gpu_peak_gib': 30.8, 'micro_batch': 1,
                     'phases': {'steady': {'gpu_reserved_gib': 30.05}}}, 'launch': {'argv': ['megatron', 'sft']}}
    (vdir / 'plan.json').write_text(json.dumps(plan))
    records = megatron_records([184.0, 9.0, 8.5, 8.0, 9.0], n=5)
    (run / 'logging.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    (vdir / 'output' / 'encode_log.jsonl').write_text(json.dumps({'mode': 'train', 'total_tokens': 4000}) + '\n')
    (run / 'first_step.json').write_text(json.dumps({  # the memory guard's (guards/megatron.py), rank 0
        'first_step_s': 183.9, 'warm': False, 'cache_entries_before': {'TRITON_CACHE_DIR': 0},
        'cache_entries_written': {'TRITON_CACHE_DIR': 41}, 'cache_dirs': {'TRITON_CACHE_DIR': '/c/triton'}}))
    assert mm.main(['--summarize-logs', str(vdir), '--steps', '5']) == 0
    out = json.loads(capsys.readouterr().out)
    v = out['variants']['mg_f32']
    assert v['first_step'] == {'first_step_s': 183.9, 'warm': False, 'cache_entries_before': {'TRITON_CACHE_DIR': 0},
                               'cache_entries_written': {'TRITON_CACHE_DIR': 41}}
    assert out['derived_from_logs'] is True and '--summarize-logs' in out['command']
    assert v['peak_reserved_gib'] == pytest.approx(50.5)  # the largest memory(GiB) logged
    assert v['plan_error'] == pytest.approx(round(50.5 / 30.05 - 1, 3))
    assert v['step_s'] == pytest.approx([8.5, 8.0, 9.0], abs=1e-3) and v['first_step_s'] == 184.0
    assert v['wall_s'] is None  # not known from the logs
    with pytest.raises(SystemExit, match='plan.json: not found'):
        mm.main(['--summarize-logs', str(tmp_path / 'missing')])
    (vdir / 'plan.json').rename(vdir / 'kept.json')
    with pytest.raises(SystemExit, match='mg_f32/plan.json: not found'):
        mm.main(['--summarize-logs', str(vdir)])


# ---- the profiled step, the data wait, the fix candidates, full SFT ------------------------------------------------
def test_the_fix_candidates_reach_megatron_sft(launches):
    workers = launches['mg_mb2_workers8']
    assert flag(workers.argv, '--dataloader_num_workers') == '8'
    assert flag(workers.argv, '--dataloader_prefetch_factor') == '4'  # swift_args: Megatron-SWIFT's own argument
    assert launches['mg_mb2_cutlass'].env['NVTE_USE_CUTLASS_GROUPED_GEMM'] == '1'  # TE reads it at each GEMM call
    both = launches['mg_mb2_cutlass_workers8']
    assert both.env['NVTE_USE_CUTLASS_GROUPED_GEMM'] == '1' and flag(both.argv, '--dataloader_num_workers') == '8'
    # the recipe turns CUTLASS on itself (its env): mg_mb2 runs it as shipped, mg_mb2_nocutlass is the cuBLAS twin
    assert launches['mg_mb2'].env['NVTE_USE_CUTLASS_GROUPED_GEMM'] == '1'
    assert launches['mg_mb2_nocutlass'].env['NVTE_USE_CUTLASS_GROUPED_GEMM'] == '0'
    for name in ('mg_mb2_workers8', 'mg_mb2_cutlass', 'mg_mb2_cutlass_workers8', 'mg_mb2_nocutlass'):
        assert flag(launches[name].argv, '--micro_batch_size') == '2'
    # the grouped frozen experts (_gmm), the grouped LoRA factors (_glora) and the coalesced optimizer (_co) reach the
    # training process's environment; every other variant runs the settings before them, whatever the recipe ships
    # (the benchmark's BASE_SETTINGS: the recipe ships all of them since 2026-12-07)
    for name in ('mg_mb2_cutlass_gmm', 'mg_mb4_te_ce_gmm', 'mg_mb4_te_ce_gmm_pao', 'mg_shipped'):
        env = launches[name].env
        assert env['SWIFT_VORA_MEGATRON_EXPERT_BASE'] == 'grouped_mm' and env['SWIFT_VORA_MEGATRON_EXPERT_LORA'] == 'te'
        assert env['SWIFT_VORA_MEGATRON_OPTIMIZER'] == 'per_tensor'
        assert 'vora_coalesced_optimizer' not in launches[name].argv
    glora, co = launches['mg_mb4_te_ce_gmm_pao_glora'], launches['mg_mb4_te_ce_gmm_pao_glora_co']
    assert glora.env['SWIFT_VORA_MEGATRON_EXPERT_LORA'] == 'grouped_mm'
    assert glora.env['SWIFT_VORA_MEGATRON_OPTIMIZER'] == 'per_tensor' and 'vora_coalesced_optimizer' not in glora.argv
    assert co.env['SWIFT_VORA_MEGATRON_OPTIMIZER'] == 'coalesced' and 'vora_coalesced_optimizer' in co.argv
    for name in ('mg_mb4_te_ce', 'mg_mb2', 'mg_base'):
        assert launches[name].env['SWIFT_VORA_MEGATRON_EXPERT_BASE'] == 'te'
        assert '--use_precision_aware_optimizer' not in launches[name].argv
    assert flag(launches['mg_base'].argv, '--cross_entropy_fusion_impl') == 'native'
    assert flag(launches['mg_shipped'].argv, '--use_precision_aware_optimizer') == 'true'
    # one micro-batch of 4 a step, with TE's cross entropy (what makes it fit an H100)
    for name in ('mg_mb4_te_ce', 'mg_mb4_te_ce_gmm', 'mg_mb4_te_ce_gmm_pao'):
        assert flag(launches[name].argv, '--micro_batch_size') == '4'
        assert flag(launches[name].argv, '--cross_entropy_fusion_impl') == 'te'
    assert flag(launches['mg_mb4_te_ce_gmm_pao'].argv, '--use_precision_aware_optimizer') == 'true'


def test_the_names_moe_calls_takes_for_one_setting_launch_the_same(launches):
    """benchmarks/moe_calls.py pairs a lever with either name of SAME_SETTINGS as its twin: they must launch the same
    megatron sft (argv and environment, apart from the recorded list of overrides)."""
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    import moe_calls
    def launched(name):  # the fixture gives each variant its own output folder, /tmp/NAME
        launch = launches[name]
        env = {k: v for k, v in launch.env.items() if k != 'SWIFT_VORA_RECIPE_OVERRIDES'}
        return ([a.replace(f'/tmp/{name}', '/tmp/OUT') for a in launch.argv],
                {k: v.replace(f'/tmp/{name}', '/tmp/OUT') for k, v in env.items()})

    for one, other in moe_calls.SAME_SETTINGS.items():
        assert launched(one) == launched(other), (one, other)


def test_the_fusion_twin_differs_from_mg_mb2_cutlass_only_in_the_fusion_flag(launches):
    fused, unfused = launches['mg_mb2_cutlass'], launches['mg_mb2_cutlass_nofusion']
    fusion = '--gradient_accumulation_fusion'
    assert unfused.argv.count(fusion) == 1 and flag(unfused.argv, fusion) == 'false'
    # mg_mb2_cutlass leaves the fusion to Megatron-SWIFT and the launch's apex check (which adds the same flag only
    # where apex lacks its CUDA extension): the rest of the two launches is the same
    without = [a for i, a in enumerate(unfused.argv) if a != fusion and (i == 0 or unfused.argv[i - 1] != fusion)]
    stripped = [a for i, a in enumerate(fused.argv) if a != fusion and (i == 0 or fused.argv[i - 1] != fusion)]
    assert without == [a.replace('mg_mb2_cutlass', 'mg_mb2_cutlass_nofusion') for a in stripped]
    own = ('SWIFT_VORA_ENCODE_LOG', 'SWIFT_VORA_RECIPE_OVERRIDES')  # the variant's folder, its overrides
    rest = [{k: v for k, v in launch.env.items() if k not in own} for launch in (fused, unfused)]
    assert rest[0] == rest[1]
    assert unfused.env['NVTE_USE_CUTLASS_GROUPED_GEMM'] == '1'
    # the recipe sets the flag itself: the launch's apex check says nothing about this machine's apex
    assert not any('gradient accumulation fusion' in n for n in unfused.notes)


def test_a_profiled_variant_runs_one_step_more_and_names_the_profile_callback(tmp_path):
    from swift_vora.backends.launch import build_launch
    from swift_vora.backends.planning import plan_recipe
    from swift_vora.backends.recipe import load_recipe
    args = mm.parse_args(['--megatron-profile-step', '13', '--profile-variants', 'mg_mb2_cutlass'])
    assert mm.profile_step_of('mg_mb2_cutlass', args) == 13 and mm.profile_step_of('mg_mb2', args) is None
    model = mm.cut_config(CONFIG, args.layers, str(tmp_path))
    overrides = mm.megatron_overrides('mg_mb2_cutlass', args, mt.budget(False), model, 'data/train.jsonl',
                                      str(tmp_path / 'o'), False)
    assert 'train.max_steps=13' in overrides and 'train.save_steps=13' in overrides
    recipe = load_recipe(mm.RECIPE, overrides)
    launch = build_launch(plan_recipe(recipe), recipe, environ={'SWIFT_VORA_PROFILE_STEP': '13'})
    assert flag(launch.argv, '--train_iters') == '13' and 'vora_step_profile' in launch.argv
    with pytest.raises(SystemExit):  # the profiler slows the step it profiles: never a measured one
        mm.parse_args(['--megatron-profile-step', '12'])


def test_the_measured_steps_stop_before_the_profiled_one_and_carry_their_data_wait(tmp_path):
    steps = [30.0, 2.0] + [1.0] * 10 + [9.0]  # step 13: profiled
    records = megatron_records(steps, n=13)
    stats = mm.megatron_step_stats(records, 8000, 4, 2, last=12)
    assert stats['step_s'] == pytest.approx([1.0] * 10, abs=1e-3) and stats['max_step_s'] == pytest.approx(1.0)
    run = tmp_path / 'output' / 'v0-1'
    run.mkdir(parents=True)
    (run / 'data_wait.rank0.jsonl').write_text(''.join(  # backends/megatron_profile.py's rows, one per step
        json.dumps({'iteration': k, 'data_wait_s': 0.5 if k <= 2 else 0.01, 'next_calls': 2}) + '\n'
        for k in range(1, 14)))
    args = mm.parse_args([])
    found = mm.data_wait(str(tmp_path / 'output'), str(run), args, stats)
    assert found['data_wait_s'] == [0.01] * 10  # steps 3-12: the warm-up and the profiled step left out
    assert found['data_wait_fraction'] == pytest.approx(0.01) and found['slowest_over_median'] == 1.0


def test_the_profiled_steps_trace_is_attributed_and_comes_back_beside_the_result(tmp_path):
    import gzip

    from test_megatron_profile import hand_built_trace
    run = tmp_path / 'v' / 'output' / 'v0-1'
    run.mkdir(parents=True)
    (run / 'logging.jsonl').write_text('{}\n')
    with gzip.open(run / 'torch_trace.json.gz', 'wt') as f:
        json.dump(hand_built_trace(), f)
    args = mm.parse_args(['--out', str(tmp_path / 'out'), '--name', 'megatron-h200-moe-x'])
    (tmp_path / 'out').mkdir()
    found = mm.step_profile('mg_mb2', str(tmp_path / 'v' / 'output'), str(tmp_path / 'v'), args)
    assert found['attribution']['window_ms'] == 1.0 and found['torch_profile'] is None
    assert found['trace'] == 'megatron-h200-moe-x-mg_mb2-torch_trace.json.gz'
    assert (tmp_path / 'out' / found['trace']).exists() and not (run / 'torch_trace.json.gz').exists()
    assert '| expert GEMMs |' in (tmp_path / 'v' / 'step_attribution.md').read_text()


@pytest.fixture(scope='module')
def full_launches(tmp_path_factory):
    from swift_vora.backends.launch import build_launch
    from swift_vora.backends.planning import plan_recipe
    from swift_vora.backends.recipe import load_recipe
    args = mm.parse_args(['--layers', '4'])
    model = mm.cut_config(CONFIG, 4, str(tmp_path_factory.mktemp('cfg4')))
    before = set(sys.modules)
    found = {}
    for name in mm.MEGATRON_FULL_LEVERS:
        recipe = load_recipe(mm.recipe_of(name), mm.megatron_overrides(
            name, args, mt.budget(False), model, 'data/train.jsonl', f'/tmp/{name}', name == mm.FULL_FLAGSHIP))
        plan = plan_recipe(recipe)
        assert plan.verdict == 'fits', (name, plan.reasons)  # every full variant fits one H200 at 4 layers
        found[name] = (plan, build_launch(plan, recipe, environ={'SWIFT_VORA_PROFILE_STEP': '0'}))
    yield found
    for name in set(sys.modules) - before:  # as `launches` above: no half-imported swift.megatron left behind
        if name.startswith(('swift.megatron', 'megatron', 'mcore_bridge')):
            sys.modules.pop(name, None)


def test_full_sft_variants_train_every_weight_at_ep1(full_launches):
    plan, launch = full_launches['mgf']
    assert plan.backend == 'megatron_ep_full' and plan.gpu_peak_gib < 139.8 * 0.8
    assert flag(launch.argv, '--tuner_type') == 'full' and flag(launch.argv, '--expert_model_parallel_size') == '1'
    assert flag(launch.argv, '--lr') == '0.0001' and '--lora_rank' not in launch.argv
    assert flag(launch.argv, '--save_steps') == '12' and 'vora_step_profile' in launch.argv  # the data wait
    assert flag(full_launches['mgf_freeze_router'][1].argv, '--freeze_parameters_regex') == r'\.mlp\.router\.'
    assert full_launches['mgf_te_ce'][0].gpu_peak_gib < plan.gpu_peak_gib < full_launches['mgf_mb2'][0].gpu_peak_gib


def test_full_sft_argvs_parse_with_megatron_swift(full_launches):
    from megatron_args import validate_argv
    validate_argv([launch.argv[2:] for _, launch in full_launches.values()])


def test_a_full_sft_call_checks_its_own_run():
    assert mm.flagship_of(['mgf_te_ce', 'mgf']) == 'mgf'
    assert mm.flagship_of([mm.FLAGSHIP, 'swift_peft']) == mm.FLAGSHIP  # a LoRA call's: the recipe's settings
    assert mm.flagship_of(['mg_mb2', 'swift_peft'], lora='mg_mb2') == 'mg_mb2'  # or --flagship-variant
    assert mm.flagship_of(['mgf_te_ce', 'mgf_mb2']) == 'mgf_te_ce'  # an H100's call of the variants that fit it
    report = {k: None for k in mm.REPORT_KEYS} | {'failures': [], 'backend': 'megatron_ep_full'}
    files = {'fingerprint': 'a', 'memory': 'b', 'lora_update': 'c'}
    final = mm.assemble({'flagship_variant': 'mgf', 'variants': {
        'mgf': {'tokens_per_s': 3000.0, 'report': report, 'guard_files': files}}})
    assert final['failures'] == [] and final['tokens_per_s'] == 3000.0 and final['backend_ratio'] is None
    missing = mm.assemble({'flagship_variant': 'mgf', 'variants': {'mgf': {'failed': 'CUDA out of memory'}}})
    assert 'mgf (the checked run) did not report: CUDA out of memory' in missing['failures'][0]


def test_the_checked_lora_run_may_be_the_recipes_shipped_settings(tmp_path):
    """--flagship-variant mg_shipped: the lever call's twin is also the checked run -- it writes the merged copy the
    expert check reads, its twin-less levers do not; a name that is no Megatron LoRA variant is refused."""
    names = ['mg_shipped', 'mg_mb4_te_ce_gmm_pao_glora', 'vora_unsloth_best']
    args = mm.parse_args(['--flagship-variant', 'mg_shipped', '--variants', ','.join(names)])
    assert mm.flagship_of(names, args.flagship_variant) == 'mg_shipped'
    assert mm.flagship_of(['mgf', *names], args.flagship_variant) == 'mgf'  # a full-SFT call checks its own run
    model = '/m'
    for name, merged in (('mg_shipped', 'true'), ('mg_mb4_te_ce_gmm_pao_glora', 'false')):
        overrides = mm.megatron_overrides(name, args, mt.budget(False), model, 'a.jsonl', '/o',
                                          name == mm.flagship_of(names, args.flagship_variant))
        assert f'megatron.merge_lora={merged}' in overrides, name
    with pytest.raises(SystemExit):
        mm.parse_args(['--flagship-variant', 'mgf'])
    with pytest.raises(SystemExit):  # a checked run the call would not train: refused before the model is built
        mm.parse_args(['--flagship-variant', 'mg_shipped', '--variants', 'mg_mb4_te_ce_gmm_pao_glora'])
    assert mm.parse_args(['--flagship-variant', 'mg_shipped', '--variants', 'mg_mb4_te_ce', '--no-flagship'])
    profiled = mm.parse_args(['--flagship-variant', 'mg_shipped', '--megatron-profile-step', '13',
                              '--profile-variants', 'mg_shipped', '--variants', 'mg_shipped'])
    with pytest.raises(SystemExit, match='the checked run is not profiled'):
        mm.run_megatron('mg_shipped', profiled, mt.budget(False), {'model': model, 'annotations': 'a.jsonl'},
                        str(tmp_path), flagship=True)
