"""The wheels the MoE tests read are the ones the code pins and the GPU machine installs (tests/moe_wheels.py)."""
import os
import re

import moe_wheels

from swift_vora import patches


def test_the_pins_are_the_gpu_sets_and_the_patch_inventorys():
    with open(os.path.join(moe_wheels.REPO, 'scripts', 'gpu', 'fetch_wheels.sh')) as f:
        script = f.read()
    installed = dict(re.findall(r'\b(unsloth(?:[-_]zoo)?)==([0-9.]+)', script))
    assert {name.replace('-', '_'): v for name, v in installed.items()} == moe_wheels.PINS
    pinned = {version for p in patches.PATCHES if p.package == 'unsloth_zoo' for version in p.sources}
    assert pinned == {moe_wheels.PINS['unsloth_zoo']}


def test_a_wheel_is_found_only_at_its_pinned_version(tmp_path, monkeypatch):
    monkeypatch.setattr(moe_wheels, 'GPU_SET', str(tmp_path / 'moe'))
    monkeypatch.setattr(moe_wheels, 'FETCHED', str(tmp_path / 'fetched'))
    (tmp_path / 'fetched').mkdir()
    (tmp_path / 'fetched' / 'unsloth_zoo-2026.1.1-py3-none-any.whl').write_bytes(b'')
    assert moe_wheels.wheel('unsloth_zoo') is None and moe_wheels.wheels() == []
    pinned = tmp_path / 'fetched' / f'unsloth_zoo-{moe_wheels.PINS["unsloth_zoo"]}-py3-none-any.whl'
    pinned.write_bytes(b'')
    assert moe_wheels.wheel('unsloth_zoo') == str(pinned)
    assert moe_wheels.wheels() == []  # unsloth_zoo alone: unsloth is missing
