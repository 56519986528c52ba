"""Pixels handed over in the model's dtype (swift_vora/speed/pixel_dtype.py): the template casts what the model would
cast first, so the model computes the same thing from half the bytes; a tower in another dtype stops training."""
import types

import pytest
import torch

from swift_vora.speed import pixel_dtype
from swift_vora.synthetic import write_video


@pytest.fixture(scope='module')
def processor(tiny_model_dir):
    import swift_vora
    swift_vora.register()
    from swift.model import get_processor
    return get_processor(tiny_model_dir, model_type='qwen3_vl')


@pytest.fixture(scope='module')
def video(tmp_path_factory):
    return write_video(str(tmp_path_factory.mktemp('video') / 'red.mp4'), duration=8.0, intervals=[(2.0, 5.0)],
                       fps=4.0, size=(128, 96))


def encode(processor, video, monkeypatch, setting):
    from swift.template import get_template
    if setting is None:
        monkeypatch.delenv(pixel_dtype.ENV, raising=False)
    else:
        monkeypatch.setenv(pixel_dtype.ENV, setting)
    template = get_template(processor, template_type='video_ora', max_length=4096)
    template.set_mode('train')
    row = {'messages': [{'role': 'user', 'content': '<video>\nQuery: red square'},
                        {'role': 'assistant', 'content': '[[2.0, 5.0]]'}],
           'videos': [video], 'chat_template_kwargs': {'video_start': 0.0, 'video_end': 8.0, 'fps': 2.0}}
    return template, template.encode(row)


def test_template_hands_over_the_cast_the_model_would_make(processor, video, monkeypatch):
    assert processor.model_info.torch_dtype == torch.bfloat16
    template, half = encode(processor, video, monkeypatch, None)
    assert template.vora_pixel_dtype == torch.bfloat16
    _, full = encode(processor, video, monkeypatch, 'float32')
    assert full['pixel_values_videos'].dtype == torch.float32
    assert half['pixel_values_videos'].dtype == torch.bfloat16
    assert torch.equal(half['pixel_values_videos'], full['pixel_values_videos'].to(torch.bfloat16))
    assert half['input_ids'] == full['input_ids'] and torch.equal(half['video_grid_thw'], full['video_grid_thw'])


def test_model_computes_the_same_logits_from_either(processor, video, monkeypatch, tiny_model_dir):
    from transformers import AutoModelForImageTextToText
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    _, full = encode(processor, video, monkeypatch, 'float32')
    _, half = encode(processor, video, monkeypatch, 'model')

    def logits(encoded):
        types_ = encoded['mm_token_type_ids']
        with torch.no_grad():
            return model(input_ids=torch.tensor([encoded['input_ids']]),
                         mm_token_type_ids=torch.as_tensor(types_).reshape(1, -1),
                         pixel_values_videos=encoded['pixel_values_videos'],
                         video_grid_thw=encoded['video_grid_thw']).logits

    assert torch.equal(logits(full), logits(half))
    model.float()  # a float32 tower would see rounded pixels: the outputs differ, which is what the check prevents
    assert not torch.equal(logits(full), logits(half))


def test_check_stops_training_when_the_tower_runs_in_another_dtype(tiny_model_dir):
    from transformers import AutoModelForImageTextToText
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    assert pixel_dtype.vision_tower_dtype(model) == torch.bfloat16
    trainer = types.SimpleNamespace(template=types.SimpleNamespace(vora_pixel_dtype=torch.bfloat16), model=model)
    check = pixel_dtype.PixelDtypeCheck.__new__(pixel_dtype.PixelDtypeCheck)
    check.trainer = trainer
    check.on_train_begin(None, None, None, model=model)  # bf16 tower, bf16 pixels: fine
    model.model.visual.float()
    with pytest.raises(ValueError, match='vision tower runs in torch.float32.*SWIFT_VORA_PIXEL_DTYPE=float32'):
        check.on_train_begin(None, None, None, model=model)
    trainer.template.vora_pixel_dtype = None  # float32 pixels: nothing to check
    check.on_train_begin(None, None, None, model=model)


def test_switch_and_dtypes():
    assert pixel_dtype.target_dtype(torch.bfloat16, {}) == torch.bfloat16
    assert pixel_dtype.target_dtype(torch.float16, {}) == torch.float16
    assert pixel_dtype.target_dtype(torch.float32, {}) is None  # a float32 model is never cast
    assert pixel_dtype.target_dtype(None, {}) is None
    assert pixel_dtype.target_dtype(torch.bfloat16, {pixel_dtype.ENV: 'off'}) is None
    with pytest.raises(ValueError, match="SWIFT_VORA_PIXEL_DTYPE='fp32'"):
        pixel_dtype.target_dtype(torch.bfloat16, {pixel_dtype.ENV: 'fp32'})
    encoded = {'pixel_values': torch.ones(2, 3), 'pixel_values_videos': None, 'input_ids': [1, 2]}
    pixel_dtype.cast_pixels(encoded, torch.bfloat16)
    assert encoded['pixel_values'].dtype == torch.bfloat16 and encoded['pixel_values_videos'] is None
