"""benchmarks/calibrate_memory.py runs end to end on CPU (--dry-run): tiny configs, real video token layout."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script():
    spec = importlib.util.spec_from_file_location('calibrate_memory', os.path.join(ROOT, 'benchmarks',
                                                                                  'calibrate_memory.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_writes_measured_next_to_predicted(tmp_path):
    mod = load_script()
    out = tmp_path / 'calib.json'
    rc = mod.main(['--dry-run', '--only', 'tiny_qwen3_vl_moe|tiny_qwen3_moe', '--out', str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data['meta']['device'] == 'cpu' and 'torch' in data['meta']
    names = [r['name'] for r in data['results']]
    assert names == ['tiny_qwen3_vl_moe-lora', 'tiny_qwen3_moe-full-text']
    for r in data['results']:
        assert r['error'] is None, r.get('traceback')
        assert set(r['measured']) == {'load', 'first_step', 'steady'}
        assert set(r['predicted']['phases']) == {'load', 'first_step', 'steady'}
        assert r['measured_trainable_params'] == r['predicted']['trainable_params']
        assert r['loss'] > 0
    video = data['results'][0]
    assert video['tokens']['groups'] == 4 and video['tokens']['vision_tokens'] == 16


def test_default_matrix_configs_exist():
    mod = load_script()
    for entry in mod.DEFAULT_MATRIX + mod.DRY_RUN_MATRIX:
        assert os.path.isfile(entry['config']), entry['config']
