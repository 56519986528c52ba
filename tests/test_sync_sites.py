"""swift_vora/backends/sync_sites.py: the Python calls that make the host wait for the GPU, by call site -- in the
dense benchmark's instrumented step and in the Unsloth runner's profiled step (SWIFT_VORA_PROFILE_STEP)."""
import json
import warnings

import torch

from swift_vora.backends.step_profile import StepProfiler
from swift_vora.backends.sync_sites import SyncRecorder


def _sync_here():
    # what torch's sync debug mode raises on CUDA for `.item()`, `.tolist()`, a boolean index, ...
    warnings.warn('called a synchronizing CUDA operation', UserWarning)


def test_sync_recorder_counts_by_call_site_and_passes_other_warnings_on():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        with SyncRecorder(depth=2) as rec:
            for _ in range(3):
                _sync_here()
            warnings.warn('something else', UserWarning)
    summary = rec.summary()
    assert summary['syncs'] == 3 and summary['sites'] == 1
    assert '_sync_here' in summary['by_site'][0]['site']
    assert [str(w.message) for w in seen] == ['something else']
    if torch.cuda.is_available():
        assert torch.cuda.get_sync_debug_mode() == 0


def test_the_profiled_step_of_the_runner_names_its_syncs(tmp_path, monkeypatch):
    """Step 2 profiled: its two synchronising calls land in torch_profile.json by site; step 1's and step 3's do not."""
    monkeypatch.setenv('SWIFT_VORA_PROFILE_STEP', '2')
    profiler = StepProfiler(str(tmp_path))
    x = torch.randn(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # the unprofiled steps' warnings go nowhere
        for n in (1, 2, 3):
            with profiler.step(n):
                (x @ x).sum()
                _sync_here()
                if n == 2:
                    _sync_here()
    syncs = json.loads((tmp_path / 'torch_profile.json').read_text())['syncs']
    assert syncs['syncs'] == 2 and syncs['sites'] == 2
    assert all('_sync_here' in s['site'] and 'test_sync_sites.py' in s['site'] for s in syncs['by_site'])
