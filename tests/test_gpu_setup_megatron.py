"""scripts/gpu/setup_megatron.sh: the Transformer Engine core wheel arrives on the GPU machine in three parts (one
per device call); set-up must reassemble them in order, refuse a missing or altered part before installing
anything, and install every TE wheel in one `pip install --target` so that their shared transformer_engine/
folder keeps all files. Small fake wheels stand in for the real ones (same layout, bytes instead of 171 MiB)."""
import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'scripts', 'gpu', 'setup_megatron.sh')
CORE = 'transformer_engine_cu13-2.11.0-py3-none-any.whl'


def sha256(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_wheel(path, name, version, files):
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding `files` {archive path: text}."""
    dist = f'{name}-{version}.dist-info'
    with zipfile.ZipFile(path, 'w') as z:
        for arc, text in files.items():
            z.writestr(arc, text)
        z.writestr(f'{dist}/METADATA', f'Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n')
        z.writestr(f'{dist}/WHEEL', 'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
        z.writestr(f'{dist}/RECORD', '')


@pytest.fixture
def carried(tmp_path):
    """What fetch_wheels.sh megatron leaves: .whl/megatron (small wheels + SHA256SUMS) and .te0-.te2 (core parts)."""
    wheels = tmp_path / 'whl'
    wheels.mkdir()
    core = tmp_path / CORE
    # Both wheels write into transformer_engine/, as TE's core and meta wheels do; padding makes three real parts.
    write_wheel(core, 'transformer_engine_cu13', '2.11.0',
                {'transformer_engine/common/__init__.py': 'CORE = True\n', 'transformer_engine/common/pad.bin':
                 os.urandom(3000).hex()})
    write_wheel(wheels / 'transformer_engine-2.11.0-py3-none-any.whl', 'transformer_engine', '2.11.0',
                {'transformer_engine/__init__.py': 'META = True\n'})
    data = core.read_bytes()
    size = len(data) // 3 + 1
    lines = [f'{sha256(core)}  {CORE}']
    for i in range(3):
        folder = tmp_path / f'.te{i}'
        folder.mkdir()
        part = folder / f'{CORE}.part{i}'
        part.write_bytes(data[i * size:(i + 1) * size])
        lines.append(f'{sha256(part)}  .te{i}/{CORE}.part{i}')
    (wheels / 'SHA256SUMS').write_text('\n'.join(lines) + '\n')
    return tmp_path, data


def run(tmp_path, mode):
    env = dict(os.environ, SWIFT_VORA_PYTHON=sys.executable, SWIFT_VORA_MEGATRON_WHEELS=str(tmp_path / 'whl'),
               SWIFT_VORA_TE_PARTS=str(tmp_path), SWIFT_VORA_TE_WORK=str(tmp_path / 'work'),
               SWIFT_VORA_MEGATRON_SITE=str(tmp_path / 'site'), SWIFT_VORA_TE_READY=str(tmp_path / 'te-ready'))
    return subprocess.run(['bash', SCRIPT, mode], env=env, capture_output=True, text=True, timeout=120)


def test_parts_reassemble_into_the_checked_wheel(carried):
    tmp_path, data = carried
    proc = run(tmp_path, 'assemble')
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / 'work' / CORE).read_bytes() == data
    assert 'reassembled and checked' in proc.stdout


@pytest.mark.parametrize('damage', ['altered', 'truncated', 'missing'])
def test_a_bad_part_is_refused_before_anything_is_installed(carried, damage):
    tmp_path, _ = carried
    part = tmp_path / '.te1' / f'{CORE}.part1'
    if damage == 'altered':
        raw = bytearray(part.read_bytes())
        raw[10] ^= 0xFF
        part.write_bytes(bytes(raw))
    elif damage == 'truncated':
        part.write_bytes(part.read_bytes()[:-5])
    else:
        part.unlink()
    proc = run(tmp_path, 'install')
    assert proc.returncode == 1
    assert 'refused' in proc.stderr and '.te1/' in proc.stderr
    assert not (tmp_path / 'work' / CORE).exists() and not (tmp_path / 'site').exists()


def test_a_wrong_whole_wheel_checksum_is_refused(carried):
    tmp_path, _ = carried
    sums = tmp_path / 'whl' / 'SHA256SUMS'
    lines = sums.read_text().splitlines()
    lines[0] = '0' * 64 + lines[0][64:]  # the parts match, their concatenation does not
    sums.write_text('\n'.join(lines) + '\n')
    proc = run(tmp_path, 'assemble')
    assert proc.returncode == 1 and 'reassembled' in proc.stderr
    assert not list((tmp_path / 'work').glob('*.whl*'))


def test_one_install_keeps_every_file_of_the_shared_transformer_engine_folder(carried):
    tmp_path, _ = carried
    proc = run(tmp_path, 'install')
    assert proc.returncode == 0, proc.stderr
    site = tmp_path / 'site'
    assert (site / 'transformer_engine' / '__init__.py').read_text() == 'META = True\n'
    assert (site / 'transformer_engine' / 'common' / '__init__.py').read_text() == 'CORE = True\n'
    # a second run finds the stamp and does not reinstall
    again = run(tmp_path, 'install')
    assert again.returncode == 0 and 'already holds' in again.stdout


def test_apexs_two_wheels_go_in_with_the_set(carried):
    """fetch_wheels.sh megatron puts apex's Python package and its fused_weight_gradient_mlp_cuda extension (a
    top-level module megatron-core imports) into .whl/megatron as two wheels: both are installed, under no filter."""
    tmp_path, _ = carried
    write_wheel(tmp_path / 'whl' / 'apex-0.1-py3-none-any.whl', 'apex', '0.1', {'apex/__init__.py': 'APEX = 1\n'})
    # (the real one is cp312-cp312-linux_x86_64 with a .so; pure here, so that any test interpreter installs it)
    write_wheel(tmp_path / 'whl' / 'apex_fused_weight_gradient_mlp_cuda-0.1+cu130.torch2.11.0-py3-none-any.whl',
                'apex_fused_weight_gradient_mlp_cuda', '0.1+cu130.torch2.11.0',
                {'fused_weight_gradient_mlp_cuda.py': 'WGRAD = 1\n'})
    proc = run(tmp_path, 'install')
    assert proc.returncode == 0, proc.stderr
    site = tmp_path / 'site'
    assert (site / 'apex' / '__init__.py').read_text() == 'APEX = 1\n'
    assert (site / 'fused_weight_gradient_mlp_cuda.py').read_text() == 'WGRAD = 1\n'
    assert 'installed 4 wheels' in proc.stdout  # TE core + meta + apex's two


def test_without_sha256sums_it_says_what_to_carry(tmp_path):
    (tmp_path / 'whl').mkdir()
    proc = run(tmp_path, 'assemble')
    assert proc.returncode == 1 and 'fetch_wheels.sh megatron' in proc.stderr


def test_a_slim_wheel_in_one_part_installs(carried):
    """fetch_wheels.sh's default (scripts/gpu/slim_te.py): the whole core wheel in .te0 alone, one device call."""
    tmp_path, data = carried
    core = tmp_path / CORE
    for i in range(3):
        for path in (tmp_path / f'.te{i}').iterdir():
            path.unlink()
    (tmp_path / '.te0' / f'{CORE}.part0').write_bytes(data)
    (tmp_path / 'whl' / 'SHA256SUMS').write_text(f'{sha256(core)}  {CORE}\n{sha256(core)}  .te0/{CORE}.part0\n')
    proc = run(tmp_path, 'install')
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / 'work' / CORE).read_bytes() == data
    assert (tmp_path / 'site' / 'transformer_engine' / 'common' / '__init__.py').is_file()
