"""Guard `supervision`: a batch without supervised tokens trains nothing, silently; the guard stops on it."""
import json
import types

import pytest
import swift  # noqa: F401  (a test dependency: pyproject [test])
import torch

ROW = {'messages': [{'role': 'user', 'content': 'Query: item 0 with a long question that fills the context'},
                    {'role': 'assistant', 'content': '[[1.0, 3.0]]'}]}


@pytest.fixture(scope='module')
def truncating_template(tiny_model_dir):
    """ms-swift's own qwen3_vl template with a max_length that cuts the answer (truncation_strategy right)."""
    from swift.model import get_processor
    from swift.template import get_template
    processor = get_processor(tiny_model_dir, model_type='qwen3_vl')
    template = get_template(processor, template_type='qwen3_vl', max_length=16, truncation_strategy='right')
    template.set_mode('train')
    return template


def _collate(samples):
    """One-sample batches as ms-swift's collator builds them (input_ids / labels as [1, L] tensors)."""
    (sample,) = samples
    return {'input_ids': torch.tensor([sample['input_ids']]), 'labels': torch.tensor([sample['labels']])}


def test_truncated_answer_gives_a_batch_without_supervision_then_guard_stops(truncating_template, tmp_path):
    template = truncating_template
    encoded = template.encode(dict(ROW), return_length=True)
    batch = _collate([encoded])
    # Reproduce: ms-swift's encoder truncates the answer away and hands on labels that are all -100
    # (no error, no warning).
    assert len(encoded['input_ids']) == 16 and (batch['labels'] != -100).sum() == 0

    from swift_vora.guards.common import GuardError, MetaCollator
    from swift_vora.guards.supervision import SupervisionGuard
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    calls = []
    trainer = types.SimpleNamespace(args=args, train_dataset=None, data_collator=_collate,
                                    training_step=lambda model, inputs, *a, **k: calls.append(inputs),
                                    state=types.SimpleNamespace(global_step=0))
    guard = SupervisionGuard(args, trainer)
    guard.on_init_end(args, trainer.state, None)
    assert isinstance(trainer.data_collator, MetaCollator)
    supervised = trainer.data_collator([{'input_ids': [1, 2, 3], 'labels': [-100, 2, 3]}])
    trainer.training_step(None, supervised)  # supervised: passes through to the real step
    assert len(calls) == 1 and '_vora_batch' not in calls[0]
    bad = trainer.data_collator([template.encode(dict(ROW), return_length=True)])
    with pytest.raises(GuardError, match='no supervised tokens'):
        trainer.training_step(None, bad)
    assert len(calls) == 1  # the empty batch never reached the model
    guard.on_train_end(args, trainer.state, None)
    report = json.load(open(tmp_path / 'supervision.rank0.json'))
    assert report['per_batch']['count'] == 2 and report['per_batch']['min'] == 0


def test_distribution_report():
    from swift_vora.guards.supervision import distribution
    d = distribution([5, 1, 9, 3])
    assert d['min'] == 1 and d['max'] == 9 and d['total'] == 18 and d['zero'] == 0 and d['count'] == 4


@pytest.mark.slow
def test_real_run_with_truncated_answers(tiny_model_dir, guard_sft, tmp_path):
    rows = guard_sft.text_rows(tmp_path / 'rows.jsonl', 2)
    extra = ('--max_length', '16', '--truncation_strategy', 'right')
    # Reproduce (guards off): training "succeeds" on batches that have no supervised token.
    off = guard_sft(tiny_model_dir, rows, tmp_path / 'off', extra=extra, template='qwen3_vl',
                    env={'SWIFT_VORA_GUARDS': 'none'})
    assert off['rc'] == 0, off['log'][-3000:]
    assert "'global_step/max_steps': '2/2'" in off['log']
    # Guard on: stops at the first such batch, naming the sample.
    on = guard_sft(tiny_model_dir, rows, tmp_path / 'on', extra=extra, template='qwen3_vl',
                   env={'SWIFT_VORA_GUARDS': 'coverage,supervision'})
    assert on['rc'] != 0
    assert '[swift-vora guard supervision]' in on['log'] and 'no supervised tokens' in on['log']


@pytest.mark.slow
def test_distribution_written_per_rank(guards_ddp_run):
    import os
    assert guards_ddp_run['rc'] == 0, guards_ddp_run['log'][-3000:]
    for r in (0, 1):
        report = json.load(open(os.path.join(guards_ddp_run['run_dir'], f'supervision.rank{r}.json')))
        assert report['rank'] == r and report['per_batch']['count'] == 2 and report['per_batch']['min'] > 0
