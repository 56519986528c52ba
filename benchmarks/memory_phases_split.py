"""Where a run's activation peak sits: the first optimizer step of a `memory_phases.rank0.jsonl` (the Unsloth
runner's phase log, swift_vora/guards/memory.py) split into what the forward kept, the forward's own peak and the
backward's peak, each above the loaded model -- what the planner's activation terms are compared with.

    python benchmarks/memory_phases_split.py RUN/output/memory_phases.rank0.jsonl [...]

Each record is written on entering a phase: its `allocated_gib` is the memory at that moment, its
`peak_allocated_gib` the peak since the previous record. So for step 0 (before any optimizer state exists):
`kept_by_forward` = allocated on entering backward - loaded (layer checkpoints, vision outputs, logits, hidden
states); `forward_peak` = the peak recorded on entering backward - loaded (the vision tower's and the layers'
transients included); `backward_peak` = the peak recorded on entering the optimizer step - loaded (the LoRA
gradients included). Figures are derived from the file as the run wrote it.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List


def split(records: List[Dict[str, Any]]) -> Dict[str, float]:
    loaded = next(r for r in records if r['phase'] == 'model_loaded')['allocated_gib']
    at = {r['phase']: r for r in records if r.get('step') == 0}
    if 'backward' not in at or 'optimizer_step' not in at:
        raise ValueError('no complete first step (backward and optimizer_step records of step 0) in the log')
    return {'loaded_gib': round(loaded, 3),
            'kept_by_forward_gib': round(at['backward']['allocated_gib'] - loaded, 3),
            'forward_peak_gib': round(at['backward']['peak_allocated_gib'] - loaded, 3),
            'backward_peak_gib': round(at['optimizer_step']['peak_allocated_gib'] - loaded, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('logs', nargs='+')
    args = ap.parse_args(argv)
    for path in args.logs:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        print(json.dumps({'file': path, **split(records)}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
