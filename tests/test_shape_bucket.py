"""swift_vora/speed/shape_bucket.py: training encodes padded at their end to a multiple of N tokens -- the switch, the
template's encodes, and that the padding changes nothing a causal model trains on."""
import json

import pytest
import torch
from test_template import make_template, processor, row, video  # noqa: F401 (fixtures)

from swift_vora.speed import shape_bucket


def test_switch_and_arithmetic():
    assert shape_bucket.pad_multiple({}) == 0
    assert shape_bucket.pad_multiple({'SWIFT_VORA_COMPILE': 'layers'}) == 64  # on with compiled layers
    assert shape_bucket.pad_multiple({'SWIFT_VORA_COMPILE': 'layers', shape_bucket.ENV: '0'}) == 0
    assert shape_bucket.pad_multiple({shape_bucket.ENV: '128'}) == 128
    with pytest.raises(ValueError, match='SWIFT_VORA_PAD_MULTIPLE'):
        shape_bucket.pad_multiple({shape_bucket.ENV: 'lots'})
    assert [shape_bucket.padding_for(n, 64) for n in (6495, 6521, 6528, 1)] == [33, 7, 0, 63]
    assert shape_bucket.padding_for(6495, 64, max_length=6500) == 0  # never past max_length
    assert shape_bucket.padding_for(6495, 0) == 0


def test_training_encodes_are_padded_at_the_end(processor, video, monkeypatch, tmp_path):  # noqa: F811
    plain = make_template(processor).encode(row(video, fps=2.0))
    monkeypatch.setenv(shape_bucket.ENV, '64')
    template = make_template(processor)
    template.encode_log_path = str(tmp_path / 'encode.jsonl')
    padded = template.encode(row(video, fps=2.0))
    n, pad = len(plain['input_ids']), len(padded['input_ids']) - len(plain['input_ids'])
    assert len(padded['input_ids']) % 64 == 0 and 0 < pad < 64
    assert padded['input_ids'][:n] == plain['input_ids']
    assert padded['input_ids'][n:] == [processor.tokenizer.pad_token_id] * pad
    assert padded['labels'][:n] == plain['labels'] and padded['labels'][n:] == [-100] * pad
    assert torch.equal(padded['mm_token_type_ids'][:n], plain['mm_token_type_ids'])
    assert padded['mm_token_type_ids'][n:].tolist() == [0] * pad
    assert torch.equal(padded['pixel_values_videos'], plain['pixel_values_videos'])
    record = json.loads(open(template.encode_log_path).read().splitlines()[-1])
    assert record['tail_padding'] == pad and record['total_tokens'] == n  # the real tokens, and the padding
    # Inference and generation are never padded.
    sample = row(video, fps=2.0)
    sample['messages'] = sample['messages'][:1]
    infer = make_template(processor, mode='transformers').encode(sample)
    assert len(infer['input_ids']) < n and len(infer['input_ids']) % 64 != 0


def test_tail_padding_changes_nothing_a_causal_model_trains_on(tiny_model_dir):
    from transformers import AutoModelForImageTextToText
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.randint(0, 1000, (1, 70), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :50] = -100
    encoded = {'input_ids': ids[0].tolist(), 'labels': labels[0].tolist(), 'loss_scale': None}
    shape_bucket.pad_tail(encoded, shape_bucket.padding_for(70, 64), pad_token_id=0)
    assert len(encoded['input_ids']) == 128

    def run(input_ids, labels):
        model.zero_grad()
        out = model(input_ids=torch.tensor([input_ids]), labels=torch.tensor([labels]))
        out.loss.backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, plain_grads = run(ids[0].tolist(), labels[0].tolist())
    padded, padded_grads = run(encoded['input_ids'], encoded['labels'])
    torch.testing.assert_close(padded.logits[:, :70], plain.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded.loss, plain.loss, rtol=1e-6, atol=1e-6)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(padded_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
