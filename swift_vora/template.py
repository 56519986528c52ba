"""The `video_ora` template: Qwen3-VL / Qwen3.5 chat format with an enforced, logged video budget.

What it adds over ms-swift's `qwen3_vl` template:
- The clip `[video_start, video_end)` of a row is decoded with the frame count and frame size of the
  sample's budget (budget.py), passed to qwen_vl_utils explicitly, and the processor is told not to
  re-sample frames. The budget is then checked on the tensors that reach the model.
- Frame timestamps (`<t seconds>` before each frame pair) are window-relative, in the same frame of
  reference as the answer. ms-swift 4.6 rebases them only in its vLLM path; here it happens in every mode.
- A sample longer than `max_length` loses frames until it fits (logged); if it cannot fit, it is rejected
  with an error naming it. The answer is never truncated and a training sample always has supervised
  tokens.
- Every encoded sample is reported: frames, `video_grid_thw`, video tokens, total and supervised tokens
  (the first few at INFO, all of them as JSONL in `SWIFT_VORA_ENCODE_LOG`, which `swift-vora train` and
  the guards point into the output directory).
- The speed levers that act per sample (swift_vora/speed/encode.py): one decoder thread per video reader,
  pixels handed over in the model's dtype, training encodes padded at their end to a multiple of N tokens
  (on with compiled decoder layers): fewer distinct lengths for the kernels, nothing changed for the real tokens.
The same class serves Qwen3-VL (dense/MoE) and Qwen3.5 (dense/MoE): the vision token ids are read from
the tokenizer rather than hard-coded.
"""
from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Dict, List, Optional

import torch
from swift.template import register_template
from swift.template.templates.qwen import Qwen3VLTemplate, QwenTemplateMeta
from swift.utils import get_logger

from . import switches
from .budget import FRAME_FACTOR, VideoBudget
from .speed import encode as speed

logger = get_logger()

TEMPLATE_NAME = 'video_ora'
ENCODE_LOG_ENV = 'SWIFT_VORA_ENCODE_LOG'
LOG_FIRST_ENV = 'SWIFT_VORA_LOG_FIRST'


class SampleRejected(ValueError):
    """A sample that cannot be encoded within the limits; the message names the sample and the numbers."""


@functools.lru_cache(maxsize=4096)
def _video_header(path: str):
    """(fps, frame count, height, width) of a video file; read once per path and process (decord, else PyAV)."""
    from .video_reader import video_header
    return video_header(path)


class VideoOraTemplate(Qwen3VLTemplate):

    def init_processor(self, processor) -> None:
        super().init_processor(processor)
        if processor is None:
            return
        tokenizer = getattr(processor, 'tokenizer', processor)
        # Qwen3-VL: 151655/151656, Qwen3.5: 248056/248057 -- take them from the checkpoint's tokenizer.
        self.image_token_id = tokenizer.convert_tokens_to_ids('<|image_pad|>')
        self.video_token_id = tokenizer.convert_tokens_to_ids('<|video_pad|>')
        self.vora_budget = VideoBudget.from_env()
        self.encode_log_path = switches.read(ENCODE_LOG_ENV) or None
        self._log_first = switches.read(LOG_FIRST_ENV)
        self._logged = 0
        self._frame_cap: Optional[int] = None
        self._video_reports: List[Dict[str, Any]] = []
        # float32 pixels cast to the model's bf16/fp16 in the worker, as the model's forward would
        self.vora_pixel_dtype = speed.pixel_target(getattr(self.model_info, 'torch_dtype', None))

    # ---- video decoding under the budget -------------------------------------------------------
    def _patch_factor(self) -> int:
        image_processor = self.processor.image_processor
        return int(image_processor.patch_size) * int(image_processor.merge_size)

    def sample_budget(self, chat_template_kwargs: Optional[Dict[str, Any]]) -> VideoBudget:
        return self.vora_budget.updated(chat_template_kwargs)

    def replace_tag(self, media_type, index, inputs):
        video = inputs.videos[index] if media_type == 'video' else None
        if media_type != 'video' or self.mode == 'vllm' or not isinstance(video, str):
            return super().replace_tag(media_type, index, inputs)
        from qwen_vl_utils import fetch_video, smart_resize

        from .video_reader import prepare_video_reader
        # decord (one thread per reader), else torchcodec, else PyAV (swift_vora/video_reader.py)
        speed.before_decode(prepare_video_reader())
        kwargs = inputs.chat_template_kwargs or {}
        budget = self.sample_budget(kwargs)
        src_fps, n_src, height, width = _video_header(video)
        duration = n_src / src_fps
        start = float(kwargs.get('video_start') or 0.0)
        end = min(float(kwargs['video_end']), duration) if kwargs.get('video_end') is not None else duration
        if not 0 <= start < end:
            raise SampleRejected(f'{self._sample_name(inputs)}: clip [{start}, {end}) is empty or outside the '
                                 f'video ({duration:.2f} s, {video})')
        frames = budget.frames_for(end - start)
        if self._frame_cap is not None:
            frames = min(frames, self._frame_cap)
        available = math.floor(end * src_fps) - math.ceil(start * src_fps) + 1
        frames = min(frames, max(FRAME_FACTOR, available // FRAME_FACTOR * FRAME_FACTOR))
        factor = self._patch_factor()
        pair_tokens = budget.pair_tokens
        if budget.max_video_tokens is not None:
            pair_tokens = min(pair_tokens, budget.max_video_tokens // (frames // FRAME_FACTOR))
        pair_tokens = max(pair_tokens, 1)
        min_tokens = min(budget.min_pair_tokens, pair_tokens)
        resized_h, resized_w = smart_resize(height, width, factor, min_pixels=min_tokens * factor * factor,
                                            max_pixels=pair_tokens * factor * factor)
        element = {'video': video, 'video_start': start, 'video_end': end, 'nframes': frames,
                   'resized_height': resized_h, 'resized_width': resized_w}
        (tensor, metadata), _ = fetch_video(element, image_patch_size=self.processor.image_processor.patch_size,
                                            return_video_sample_fps=True, return_video_metadata=True)
        # Window-relative timestamps: the processor prints frames_indices / fps, so shift the indices by the
        # window start (fractional indices are fine: they are only divided by fps).
        offset = start * float(metadata['fps'])
        metadata = {**metadata, 'frames_indices': [float(i) - offset for i in metadata['frames_indices']]}
        inputs.mm_processor_kwargs.setdefault('video_metadata', []).append(metadata)
        inputs.mm_processor_kwargs['do_sample_frames'] = False  # frames are already the budget's frames
        inputs.videos[index] = tensor.to(torch.uint8)
        self._video_reports.append({'video': video, 'clip': [round(start, 3), round(end, 3)], 'frames': frames,
                                    'frame_hw': [resized_h, resized_w], 'budget': budget.to_dict()})
        return ['<|video_pad|>']

    # ---- encoding with length control and reporting --------------------------------------------
    def _encode(self, inputs) -> Dict[str, Any]:
        videos, mm_kwargs = list(inputs.videos), dict(inputs.mm_processor_kwargs)
        self._frame_cap = None
        reductions = []
        try:
            while True:
                inputs.videos, inputs.mm_processor_kwargs = list(videos), dict(mm_kwargs)
                self._video_reports = []
                encoded = super()._encode(inputs)
                length = len(encoded['input_ids'])
                if self.max_length is None or length <= self.max_length or not self._video_reports:
                    break
                frames = max(r['frames'] for r in self._video_reports)
                grid = encoded['video_grid_thw']
                merge_size = self.processor.image_processor.merge_size
                pair_tokens = int(max(g[1] * g[2] for g in grid.tolist())) // (merge_size**2)
                pairs_over = math.ceil((length - self.max_length) / max(1, pair_tokens * len(grid)))
                new_cap = frames - FRAME_FACTOR * pairs_over
                if new_cap < FRAME_FACTOR:
                    raise SampleRejected(
                        f'{self._sample_name(inputs)}: {length} tokens > max_length {self.max_length} and no frame '
                        f'count fits ({frames} frames, {pair_tokens} tokens per frame pair). Raise max_length or '
                        'lower pair_tokens.')
                reductions.append({'from_frames': frames, 'to_frames': new_cap, 'length': length})
                logger.warning(f'{self._sample_name(inputs)}: {length} tokens > max_length {self.max_length}; '
                               f'frames {frames} -> {new_cap} to fit.')
                self._frame_cap = new_cap
        finally:
            self._frame_cap = None
        padding = speed.tail_padding(len(encoded['input_ids']), self.max_length, self.is_training)
        report = self._report(inputs, encoded, reductions, tail_padding=padding)
        if self.is_training and report['supervised_tokens'] == 0:
            raise SampleRejected(f'{self._sample_name(inputs)}: no supervised tokens (empty answer?)')
        speed.finish(encoded, padding, self.tokenizer.pad_token_id, self.vora_pixel_dtype)
        return encoded

    def _sample_name(self, inputs) -> str:
        kwargs = inputs.chat_template_kwargs or {}
        name = kwargs.get('sample_id')
        if name is None and inputs.videos:
            name = inputs.videos[0] if isinstance(inputs.videos[0], str) else 'video'
        return f'sample {name}'

    def _report(self, inputs, encoded, reductions, tail_padding: int = 0) -> Dict[str, Any]:
        input_ids = encoded['input_ids']
        labels = encoded.get('labels')
        grid = encoded.get('video_grid_thw')
        report = {
            'sample_id': (inputs.chat_template_kwargs or {}).get('sample_id'),
            'mode': self.mode,
            'videos': self._video_reports,
            'video_grid_thw': grid.tolist() if grid is not None else [],
            'frames_from_tensors': int(sum(g[0] for g in grid.tolist())) * FRAME_FACTOR if grid is not None else 0,
            'video_tokens': sum(1 for t in input_ids if t == self.video_token_id),
            'total_tokens': len(input_ids),
            'supervised_tokens': sum(1 for t in labels if t != -100) if labels is not None else 0,
            'frame_reductions': reductions,
            'tail_padding': tail_padding,  # pad tokens appended after this report's counts (speed/shape_bucket.py)
            'source': 'read from the encoded tensors',
        }
        cap = max((r['budget']['max_video_tokens'] or 0) for r in self._video_reports) if self._video_reports else 0
        if cap and report['video_tokens'] > cap * len(self._video_reports):
            raise SampleRejected(f'{self._sample_name(inputs)}: {report["video_tokens"]} video tokens exceed the '
                                 f'cap {cap} after decoding (budget not applied?)')
        if self._logged < self._log_first:
            self._logged += 1
            logger.info(f'video_ora {self._sample_name(inputs)}: frames={report["frames_from_tensors"]} '
                        f'grid={report["video_grid_thw"]} video_tokens={report["video_tokens"]} '
                        f'total_tokens={report["total_tokens"]} supervised={report["supervised_tokens"]}')
        if self.encode_log_path:
            os.makedirs(os.path.dirname(os.path.abspath(self.encode_log_path)), exist_ok=True)
            with open(self.encode_log_path, 'a') as f:
                f.write(json.dumps(report) + '\n')
        return report


def register_video_ora_template() -> None:
    from swift.template import TEMPLATE_MAPPING
    if TEMPLATE_NAME in TEMPLATE_MAPPING:
        return
    register_template(QwenTemplateMeta(TEMPLATE_NAME, template_cls=VideoOraTemplate, default_system=None))
