"""The video budget a checkpoint was trained with: recorded with it, taken into inference's environment unless the
caller set a switch, the caller's value honoured with a warning naming both, bad files named with their key."""
import json

import pytest

from swift_vora import trained_budget as tb


def test_record_writes_the_budget_in_effect_and_the_answer_length(tmp_path):
    env = {'SWIFT_VORA_FPS': '1', 'SWIFT_VORA_MAX_FRAMES': '8', 'SWIFT_VORA_WINDOW': 'none'}
    path = tb.record(str(tmp_path), 'swift sft', env, max_answer_chars=29)
    data = json.loads(open(path).read())
    assert data['switches']['SWIFT_VORA_FPS'] == '1.0' and data['switches']['SWIFT_VORA_MAX_FRAMES'] == '8'
    assert data['switches']['SWIFT_VORA_WINDOW'] == 'none'  # whole videos, not the default window
    assert data['switches']['SWIFT_VORA_PAIR_TOKENS'] == '256'  # unset: the default the template used
    assert set(data['switches']) == set(tb.SWITCHES)
    assert data['answer'] == {'max_chars': 29, 'max_new_tokens': 2 * 29 + tb.ANSWER_MARGIN_TOKENS}
    assert data['source'] == 'swift sft'


def test_unset_switches_take_the_trained_values(tmp_path):
    path = tb.record(str(tmp_path), 'swift sft', {'SWIFT_VORA_MAX_FRAMES': '8', 'SWIFT_VORA_PAIR_TOKENS': '48',
                                                  'SWIFT_VORA_WINDOW': 'none'}, max_answer_chars=5)
    env = {}
    done = tb.apply_to_environment(path, env)
    assert env['SWIFT_VORA_MAX_FRAMES'] == '8' and env['SWIFT_VORA_PAIR_TOKENS'] == '48'
    assert env['SWIFT_VORA_WINDOW'] == 'none' and done['overridden'] == {}
    assert done['max_new_tokens'] == tb.MIN_NEW_TOKENS  # 2 x 5 + 16 < 32


def test_a_switch_the_caller_set_differently_wins_with_a_warning_naming_both(tmp_path):
    path = tb.record(str(tmp_path), 'swift sft', {'SWIFT_VORA_MAX_FRAMES': '8'})
    env = {'SWIFT_VORA_MAX_FRAMES': '16', 'SWIFT_VORA_FPS': '2.0'}  # FPS equal to the trained default: no warning
    warnings = []
    done = tb.apply_to_environment(path, env, warn=warnings.append)
    assert env['SWIFT_VORA_MAX_FRAMES'] == '16'
    assert done['overridden'] == {'SWIFT_VORA_MAX_FRAMES': {'given': '16', 'trained': '8'}}
    assert len(warnings) == 1 and 'SWIFT_VORA_MAX_FRAMES=16 (trained: 8)' in warnings[0] and path in warnings[0]


def test_the_file_is_found_in_the_checkpoint_or_its_run_folder(tmp_path):
    run = tmp_path / 'v0-run'
    ckpt = run / 'checkpoint-10'
    ckpt.mkdir(parents=True)
    assert tb.find(str(ckpt)) is None
    tb.record(str(run), 'swift sft', {})
    assert tb.find(str(ckpt)) == str(run / tb.FILE)
    tb.record(str(ckpt), 'swift sft', {})
    assert tb.find(None, str(ckpt)) == str(ckpt / tb.FILE)


@pytest.mark.parametrize('content, key', [
    ('{"switches": {"SWIFT_VORA_FPS": "fast"}}', 'SWIFT_VORA_FPS'),
    ('{"switches": {"SWIFT_VORA_COLOR": "1"}}', 'SWIFT_VORA_COLOR'),
    ('{"answer": {}}', 'switches'),
    ('not json', 'not a readable'),
])
def test_a_bad_budget_file_names_the_file_and_the_key(tmp_path, content, key):
    path = tmp_path / tb.FILE
    path.write_text(content)
    with pytest.raises(ValueError, match=key) as info:
        tb.apply_to_environment(str(path), {})
    assert str(path) in str(info.value)


def test_the_dataset_builder_reports_its_longest_answer(tmp_path, monkeypatch):
    from swift_vora import synthetic
    from swift_vora.dataset import build_swift_rows
    monkeypatch.setitem(tb._answer_chars, 'max', 0)
    ann = synthetic.make_dataset(str(tmp_path), n_videos=2, duration=8.0, seed=1, min_events=1)
    rows, _, _ = build_swift_rows(ann)
    longest = max(len(r['messages'][-1]['content']) for r in rows)
    assert tb._answer_chars['max'] == longest > 0


def test_the_checkpoint_records_the_query_of_its_training_prompts(tmp_path, monkeypatch):
    from swift_vora.dataset import build_swift_rows
    from swift_vora.synthetic import QUERY, make_dataset
    monkeypatch.setattr(tb, '_queries', tb.Counter())
    build_swift_rows(make_dataset(str(tmp_path / 'data'), n_videos=2, duration=8.0, seed=1, min_events=1))
    path = tb.record(str(tmp_path), 'swift sft', {}, max_answer_chars=10)
    assert tb.trained_query(path) == (QUERY, 1)
    (tmp_path / 'old').mkdir()
    (tmp_path / 'old' / tb.FILE).write_text('{"switches": {}}')  # from before queries were recorded
    assert tb.trained_query(str(tmp_path / 'old' / tb.FILE)) == (None, 0)


def test_the_callback_records_into_every_checkpoint_of_a_video_ora_training(tmp_path):
    import types
    trainer = types.SimpleNamespace(template=types.SimpleNamespace(
        template_meta=types.SimpleNamespace(template_type='video_ora')))
    args = types.SimpleNamespace(output_dir=str(tmp_path / 'v0'))
    state = types.SimpleNamespace(is_world_process_zero=True, global_step=5)
    cb = tb.record_on_save_callback(args, trainer)
    cb.on_train_begin(args, state, None)
    (tmp_path / 'v0' / 'checkpoint-5').mkdir()
    cb.on_save(args, state, None)
    assert (tmp_path / 'v0' / tb.FILE).is_file() and (tmp_path / 'v0' / 'checkpoint-5' / tb.FILE).is_file()
    other = types.SimpleNamespace(template=types.SimpleNamespace(
        template_meta=types.SimpleNamespace(template_type='qwen3_vl')))
    args2 = types.SimpleNamespace(output_dir=str(tmp_path / 'v1'))
    tb.record_on_save_callback(args2, other).on_train_begin(args2, state, None)
    assert not (tmp_path / 'v1').exists()  # another template: nothing recorded


def test_eval_takes_each_checkpoints_budget_without_changing_its_own_environment(tmp_path, monkeypatch):
    """Two checkpoints evaluated from one process (a notebook, a sweep): each gets the budget it was trained with;
    the first one's values must not stay behind in os.environ and pass for the caller's on the second."""
    import os
    import sys

    from swift_vora.eval.inference import use_trained_budget
    for name in tb.SWITCHES:
        monkeypatch.delenv(name, raising=False)
    first, second = tmp_path / 'a', tmp_path / 'b'
    first.mkdir()
    second.mkdir()
    tb.record(str(first), 'swift sft', {'SWIFT_VORA_MAX_FRAMES': '8'}, max_answer_chars=40)
    tb.record(str(second), 'swift sft', {'SWIFT_VORA_MAX_FRAMES': '32'}, max_answer_chars=40)
    before = dict(os.environ)
    env_a, env_b = dict(os.environ), dict(os.environ)
    use_trained_budget(None, str(first), None, env_a, stream=sys.stderr)
    tokens = use_trained_budget(None, str(second), None, env_b, stream=sys.stderr)
    assert env_a['SWIFT_VORA_MAX_FRAMES'] == '8' and env_b['SWIFT_VORA_MAX_FRAMES'] == '32'
    assert tokens == 2 * 40 + tb.ANSWER_MARGIN_TOKENS
    assert dict(os.environ) == before
