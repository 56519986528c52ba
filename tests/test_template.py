"""The `video_ora` template on real tensors: budget, window-relative timestamps, length control, parity."""
import re

import pytest
import torch

from swift_vora.synthetic import write_video
from swift_vora.template import SampleRejected

EVENTS = [(5.0, 9.0)]  # the red square is on screen in [5, 9) of the source video


@pytest.fixture(scope='module')
def processor(tiny_model_dir):
    import swift_vora
    swift_vora.register()
    from swift.model import get_processor
    return get_processor(tiny_model_dir, model_type='qwen3_vl')


def make_template(processor, max_length=4096, mode='train'):
    from swift.template import get_template
    template = get_template(processor, template_type='video_ora', max_length=max_length)
    template.set_mode(mode)
    return template


@pytest.fixture(scope='module')
def video(tmp_path_factory):
    path = tmp_path_factory.mktemp('video') / 'red.mp4'
    return write_video(str(path), duration=16.0, intervals=EVENTS, fps=4.0, size=(128, 96))


def row(video, answer='[[1.0, 5.0]]', start=4.0, end=12.0, **budget):
    return {'messages': [{'role': 'user', 'content': '<video>\nQuery: red square'},
                         {'role': 'assistant', 'content': answer}],
            'videos': [video], 'chat_template_kwargs': {'video_start': start, 'video_end': end,
                                                        'sample_id': 'red@4.0-12.0', **budget}}


def timestamps(processor, input_ids):
    text = processor.tokenizer.decode(input_ids)
    return [float(x) for x in re.findall(r'<(\d+\.\d) seconds>', text)]


def red_per_pair(encoded):
    """Red minus blue of each frame pair, from the patch-flattened pixel tensor the model receives."""
    pixels, (t, h, w) = encoded['pixel_values_videos'], encoded['video_grid_thw'][0].tolist()
    per_channel = pixels.shape[1] // 3
    groups = pixels.reshape(t, h * w, 3, per_channel)
    return (groups[:, :, 0].mean(dim=(1, 2)) - groups[:, :, 2].mean(dim=(1, 2))).tolist()


def test_timestamps_are_window_relative_and_match_the_rebased_answer(processor, video):
    template = make_template(processor)
    encoded = template.encode(row(video, fps=2.0, max_frames=64))
    stamps = timestamps(processor, encoded['input_ids'])
    assert len(stamps) == 8  # 8 s clip at 2 fps = 16 frames = 8 pairs
    assert 0.0 <= stamps[0] < 1.0 and stamps[-1] < 8.0  # clip time, not source time (4..12)
    red = red_per_pair(encoded)
    answer = [(1.0, 5.0)]  # EVENTS rebased to the window start
    inside = [any(s <= t < e for s, e in answer) for t in stamps]
    clear = [(r, i) for r, i in zip(red, inside) if abs(r) > 0.3 or abs(r) < 0.05]
    assert clear, red
    for r, is_inside in clear:  # a pair shows the square exactly when its timestamp is inside the answer
        assert (r > 0.3) == is_inside, (stamps, red)


def test_budget_is_applied_to_the_tensors(processor, video):
    template = make_template(processor)
    encoded = template.encode(row(video, fps=1.0, max_frames=64, pair_tokens=12, min_pair_tokens=4))
    t, h, w = encoded['video_grid_thw'][0].tolist()
    assert t * 2 == 8  # 8 s at 1 fps
    assert h * w // 4 <= 12  # tokens per frame pair within pair_tokens
    video_tokens = sum(1 for x in encoded['input_ids'] if x == template.video_token_id)
    assert video_tokens == t * h * w // 4


def test_total_video_token_cap_cuts_frames(processor, video):
    template = make_template(processor)
    encoded = template.encode(row(video, fps=4.0, max_frames=64, pair_tokens=20, max_video_tokens=60))
    video_tokens = sum(1 for x in encoded['input_ids'] if x == template.video_token_id)
    assert 0 < video_tokens <= 60


def _answer_from_labels(processor, encoded):
    return processor.tokenizer.decode([x for x in encoded['labels'] if x != -100])


def test_over_length_sample_loses_frames_never_the_answer(processor, video):
    full = make_template(processor).encode(row(video, fps=2.0, pair_tokens=20))
    short_len = len(full['input_ids']) - 50
    encoded = make_template(processor, max_length=short_len).encode(row(video, fps=2.0, pair_tokens=20))
    assert len(encoded['input_ids']) <= short_len
    assert encoded['video_grid_thw'][0][0] < full['video_grid_thw'][0][0]  # fewer frame pairs
    assert _answer_from_labels(processor, encoded) == _answer_from_labels(processor, full) == '[[1.0, 5.0]]<|im_end|>\n'


def test_sample_that_cannot_fit_is_rejected_by_name(processor, video):
    with pytest.raises(SampleRejected, match=r'red@4.0-12.0.*max_length 40'):
        make_template(processor, max_length=40).encode(row(video, fps=2.0, pair_tokens=20))


def test_empty_answer_is_still_supervised(processor, video):
    encoded = make_template(processor).encode(row(video, answer='[]', start=10.0, end=16.0))
    assert _answer_from_labels(processor, encoded) == '[]<|im_end|>\n'


def test_training_and_inference_encode_the_same_prompt(processor, video):
    train = make_template(processor, mode='train').encode(row(video, fps=2.0))
    sample = row(video, fps=2.0)
    sample['messages'] = sample['messages'][:1]
    infer = make_template(processor, mode='transformers').encode(sample)
    first_label = next(i for i, x in enumerate(train['labels']) if x != -100)
    assert train['input_ids'][:first_label] == list(infer['input_ids'])
    assert torch.equal(train['pixel_values_videos'], infer['pixel_values_videos'])


def test_encode_log_records_every_sample(processor, video, tmp_path):
    import json
    template = make_template(processor)
    template.encode_log_path = str(tmp_path / 'encode.jsonl')
    template.encode(row(video, fps=1.0))
    template.encode(row(video, fps=2.0))
    records = [json.loads(line) for line in open(template.encode_log_path)]
    assert [r['frames_from_tensors'] for r in records] == [8, 16]
    assert all(r['supervised_tokens'] > 0 and r['sample_id'] == 'red@4.0-12.0' for r in records)
