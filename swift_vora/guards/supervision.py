"""Guard `supervision`: every training batch has supervised tokens (labels != -100).

A batch whose labels are all -100 (answer truncated away by `--max_length` with `truncation_strategy right`,
a loss_scale that masks everything, an empty assistant turn in a template that does not train the end token)
produces a zero or NaN loss and no gradient; ms-swift trains on silently. The count is taken in the data
collator on the CPU tensors (common.py), so it costs no device sync. A batch with none stops the run with the
sample ids; at the end each rank writes `supervision.rank{R}.json` (distribution per batch and per sample)
and logs one line.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

from swift.callbacks import TrainerCallback

from .common import GuardError, get_tap, logger, output_dir, rank, write_json

NAME = 'supervision'


def distribution(values: List[int]) -> Dict[str, Any]:
    if not values:
        return {'count': 0}
    ordered = sorted(values)

    def pct(p: float) -> int:
        return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]

    return {'count': len(values), 'min': ordered[0], 'p10': pct(0.1), 'p50': pct(0.5), 'p90': pct(0.9),
            'max': ordered[-1], 'mean': round(sum(values) / len(values), 2), 'total': sum(values),
            'zero': sum(1 for v in values if v == 0)}


class SupervisionGuard(TrainerCallback):

    def __init__(self, args, trainer):
        super().__init__(args, trainer)
        self.per_batch: List[int] = []
        self.per_sample: List[int] = []
        self.unknown = 0

    def on_init_end(self, args, state, control, **kwargs):
        get_tap(self.trainer).add(self)

    def on_batch(self, meta, inputs) -> None:
        if not meta or 'supervised' not in meta:
            self.unknown += 1
            return
        supervised = meta['supervised']
        self.per_batch.append(supervised)
        self.per_sample.extend(meta.get('supervised_per_row') or [])
        if supervised == 0:
            ids = meta.get('sample_ids') or []
            raise GuardError(NAME, f'rank {rank()}, micro-batch {len(self.per_batch)} (global step '
                                   f'{self.trainer.state.global_step}): no supervised tokens (all labels are -100) in '
                                   f'samples {ids or "(ids not tracked)"}, input shape {meta.get("input_shape")}. The '
                                   'loss would be 0/NaN with no gradient. Typical causes: the answer was cut by '
                                   '--max_length (truncation_strategy right/left), an empty answer, or a loss_scale '
                                   'that masks every token.')

    def on_train_end(self, args, state, control, **kwargs):
        report = {'rank': rank(), 'per_batch': distribution(self.per_batch),
                  'per_sample': distribution(self.per_sample), 'batches_without_counts': self.unknown,
                  'source': 'labels != -100 in the collated batch'}
        write_json(os.path.join(output_dir(self.trainer), f'supervision.rank{rank()}.json'), report)
        b = report['per_batch']
        if b.get('count'):
            logger.info(f'swift-vora supervision (rank {rank()}): {b["count"]} micro-batches, supervised tokens per '
                        f'batch min {b["min"]} / p50 {b["p50"]} / p90 {b["p90"]} / max {b["max"]} (mean {b["mean"]}).')
