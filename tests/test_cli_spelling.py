"""ms-swift's spelling (issue #33, item 2): every flag also with underscores, a usage error shows the command's own
usage with the closest flag, and one name for the output folder (`--output_dir`, the older names kept)."""
import json

import pytest
from cli_harness import CPU_TINY, TINY_VL, run_cli
from cli_harness import strict_json as _strict_json

from swift_vora import cli


def _all_parsers():
    cli.build_parser()
    return {prog: parser for prog, parser in cli._PARSERS.items()}


def _long_flags(parser):
    return sorted(o for o in parser._option_string_actions if o.startswith('--') and '-' in o[2:])


def test_every_flag_of_every_command_reads_with_underscores():
    parsers = _all_parsers()
    assert {'swift-vora eval', 'swift-vora data build', 'swift-vora plan', 'swift-vora train', 'swift-vora demo',
            'swift-vora recipes cp'} <= set(parsers)
    checked = 0
    for prog, parser in parsers.items():
        for flag in _long_flags(parser):
            underscored = '--' + flag[2:].replace('-', '_')
            action = parser._option_string_actions[flag]
            # no other flag of the command owns the underscore spelling
            assert parser._option_string_actions.get(underscored, action) is action, (prog, flag)
            assert parser.with_hyphens([underscored]) == [flag], (prog, flag)
            assert parser.with_hyphens([f'{underscored}=7']) == [f'{flag}=7'], (prog, flag)
            checked += 1
    assert checked >= 35  # every hyphenated flag of every command (38 when this was written)
    # a value after `--` and a flag the command does not have are left as typed
    eval_parser = parsers['swift-vora eval']
    assert eval_parser.with_hyphens(['--', '--max_new_tokens']) == ['--', '--max_new_tokens']
    assert eval_parser.with_hyphens(['--no_such_flag']) == ['--no_such_flag']


def test_the_underscore_spellings_run(workspace):
    """End to end: argparse hands each command's arguments to that command's parser, which reads them."""
    rc, out, err = run_cli('data', 'build', 'a.jsonl', 'o.jsonl', '--no_probe', '--min_event=0.25', '--min_window',
                           '1', '--json')
    report = _strict_json(out)
    assert rc == 0 and report['config']['min_event'] == 0.25 and report['config']['min_window'] == 1, err
    rc, out, err = run_cli('plan', '--model', TINY_VL, '--gpus', '1', '--gpu_mem_gib', '24', '--host_ram_gib', '64',
                           '--max_frames', '16', '--micro_batch', '2', '--json')
    plan = _strict_json(out)
    assert rc == 0 and plan['micro_batch'] == 2 and plan['hardware']['gpu_mem_gib'] == 24, err
    rc, out, err = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', 'data.dataset=a.jsonl', '--dry_run', '--json')
    assert rc == 0 and 'launch' in _strict_json(out), err
    rc, out, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'p.jsonl', '--max_plots', '0',
                           '--max_new_tokens', '8', '--json')
    assert rc == 0 and _strict_json(out)['queries'] == 1, err


@pytest.mark.parametrize('argv, usage, hint', [
    (['eval', '--annotations', 'q.jsonl', '--max_new_token', '8'], 'usage: swift-vora eval ',
     'did you mean --max-new-tokens?'),
    (['eval', '--annotations', 'q.jsonl', '--out-dr', 'x'], 'usage: swift-vora eval ', 'did you mean --out-dir?'),
    (['data', 'build', 'a.jsonl', 'o.jsonl', '--windw', '3'], 'usage: swift-vora data build ',
     'did you mean --window?'),
    (['plan', '--model', TINY_VL, '--gpu_memgib', '3'], 'usage: swift-vora plan ', 'did you mean --gpu-mem-gib?'),
    (['train', CPU_TINY, '--dryrun'], 'usage: swift-vora train ', 'did you mean --dry-run?'),
    (['recipes', 'cp', 'h200x1', 'x.yaml', '--jsn'], 'usage: swift-vora recipes cp ', ''),
    (['evl', '--json'], 'usage: swift-vora ', 'did you mean eval?'),
    (['data', 'buld'], 'usage: swift-vora data ', 'did you mean build?'),
])
def test_a_usage_error_shows_the_commands_usage_and_the_closest_flag(workspace, argv, usage, hint):
    rc, out, err = run_cli(*argv)
    assert rc == 2 and err.startswith(usage), err
    assert 'usage: swift-vora [-h] [--version] COMMAND' not in err or argv[0] == 'evl'
    assert hint in err
    if '--json' in argv:
        assert hint in _strict_json(out)['error']


def test_two_unknown_flags_get_a_hint_each(workspace):
    rc, _, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'p.jsonl', '--jsn', '--stict')
    assert rc == 2 and 'did you mean --json for --jsn, --strict for --stict?' in err


def test_help_says_underscores_work(capsys):
    rc, out, _ = run_cli('eval', '--help')
    assert rc == 0 and '--output_dir for --output-dir' in ' '.join(out.split())


# ---- one name for the output folder ---------------------------------------------------------------------------------
@pytest.mark.parametrize('flag', ['--output_dir', '--output-dir', '--out-dir', '--out_dir', '--out'])
def test_eval_writes_its_report_to_any_spelling_of_output_dir(workspace, flag):
    rc, _, err = run_cli('eval', '--annotations', 'q.jsonl', '--predictions', 'p.jsonl', flag, 'report',
                         '--max-plots', '0')
    assert rc == 0, err
    assert json.loads((workspace / 'report' / 'metrics.json').read_text())['queries'] == 1


@pytest.mark.parametrize('flag', ['--output_dir', '--output-dir', '--out-dir', '--out'])
def test_demo_takes_every_spelling_of_output_dir(flag):
    parser = cli.build_parser()
    assert parser.parse_args(['demo', flag, 'here']).out == 'here'
    assert parser.parse_args(['demo']).out == 'swift_vora_demo'


def test_train_output_dir_sets_the_recipe_key(workspace):
    rc, out, err = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', 'data.dataset=a.jsonl', '--output_dir',
                           'runs/a: b', '--dry-run', '--json')
    argv = _strict_json(out)['plan']['command']
    assert rc == 0 and argv[argv.index('--output_dir') + 1] == 'runs/a: b', err
    # the flag is applied after the key=value overrides: the flag wins, as the last override does
    rc, out, _ = run_cli('train', CPU_TINY, f'model.path={TINY_VL}', 'data.dataset=a.jsonl',
                         'train.output_dir=elsewhere', '--out', 'mine', '--dry-run', '--json')
    argv = _strict_json(out)['plan']['command']
    assert rc == 0 and argv[argv.index('--output_dir') + 1] == 'mine'


@pytest.mark.parametrize('argv, said', [
    (['--learning_rate', '1e-5'], 'train.learning_rate=1e-5'),
    (['--per_device_train_batch_size', '2'], 'train.per_device_train_batch_size=2'),
    (['--lora_rank=16'], 'train.lora_rank=16'),
    (['--neftune_noise_alpha', '5'], 'swift_args.neftune_noise_alpha=5'),
])
def test_an_ms_swift_flag_train_does_not_take_points_to_its_recipe_key(capsys, argv, said):
    """ms-swift users type `--learning_rate`: `train` answers with the recipe key that sets it (an override after the
    recipe) or, for an argument no key models, `swift_args.NAME=VALUE`; a typo of train's own flag still gets it."""
    from swift_vora.cli import main
    assert main(['train', 'h200x1', *argv, '--dry-run']) == 2
    err = capsys.readouterr().err
    assert said in err and 'unrecognized arguments' in err
    assert main(['train', 'h200x1', '--dry-rn']) == 2
    assert 'did you mean --dry-run?' in capsys.readouterr().err


def test_train_without_a_recipe_asks_for_the_recipe_alone():
    rc, out, err = run_cli('train')
    assert rc == 2 and err.strip().endswith('the following arguments are required: recipe')  # overrides are optional


def test_trains_hardware_advice_names_the_recipe_keys_train_takes(workspace):
    (workspace / 'r.yaml').write_text('hardware: 3090x5\nmodel: {path: /m}\ndata: {dataset: a.jsonl}\n')
    rc, _, err = run_cli('train', 'r.yaml', '--dry-run')
    assert rc == 2 and 'for another count give gpus: N with hardware: 3090x1' in err, err
    rc, _, err = run_cli('train', 'r.yaml', 'hardware=null', 'gpus=2', '--dry-run')
    assert rc == 2 and 'gpus and gpu_mem_gib go together (or hardware: NAME gpus: N)' in err, err
    rc, _, err = run_cli('train', 'r.yaml', '--gpus', '5', '--dry-run')
    assert rc == 2 and '--gpus is the recipe key gpus: gpus=5 after the recipe, or gpus: in the file' in err, err
