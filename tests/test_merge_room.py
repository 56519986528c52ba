"""benchmarks/merge_room.py: room for the MoE flagship's merged copy beside a checkpoint that fills its filesystem.

What the full-depth benchmark relies on: base shards move to another filesystem (the last first, the fewest that
make room, none when no move can), a link stays in each one's place and the model loads the same tensors through
it; a folder in RAM asks the host's RAM too; a second run moves nothing; leftovers of a rebuilt checkpoint go.
Filesystem sizes are injected (`free`, `device`): no test needs a 65 GiB disk or root; one moves real files to a
second real filesystem where the machine has one."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'benchmarks'))
import merge_room as mr  # noqa: E402

KiB = 1024


@pytest.fixture(scope='module')
def sharded_q35(tmp_path_factory):
    """A tiny random Qwen3.5-MoE saved in several safetensors shards (as the 35B-A3B's 15)."""
    from transformers import Qwen3_5MoeForConditionalGeneration

    from swift_vora.tiny_model import qwen3_5_moe_config
    torch.manual_seed(0)
    model = Qwen3_5MoeForConditionalGeneration(qwen3_5_moe_config('tiny', None)).to(torch.bfloat16)
    out = tmp_path_factory.mktemp('sharded_q35')
    model.save_pretrained(out, safe_serialization=True, max_shard_size='400KB')
    return str(out), {k: v.clone() for k, v in model.state_dict().items()}


def copy_checkpoint(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return str(dst)


class Disks:
    """Two filesystems by bookkeeping: the checkpoint's (`where` lives on it) with `free_where` bytes free plus what
    moved off it, and the spill folder's with `free_spill` bytes free minus what moved onto it."""

    def __init__(self, model_dir, spill_dir, free_where, free_spill, same_device=False):
        self.model_dir, self.spill_dir = model_dir, spill_dir
        self.free_where, self.free_spill, self.same = free_where, free_spill, same_device

    def moved(self):
        return sum(os.path.getsize(os.path.join(self.model_dir, f)) for f in mr.shards(self.model_dir)
                   if os.path.islink(os.path.join(self.model_dir, f)))

    def free(self, path):
        if os.path.realpath(path).startswith(os.path.realpath(self.spill_dir)):
            return self.free_spill - self.moved()
        return self.free_where + self.moved()

    def device(self, path):
        return 1 if self.same or not os.path.realpath(path).startswith(os.path.realpath(self.spill_dir)) else 2


def need_bytes(model_dir):
    return mr.weights_bytes(model_dir) * mr.MERGED_OVER_BASE


def test_the_fewest_last_shards_move_and_the_model_loads_the_same_tensors_through_the_links(sharded_q35, tmp_path):
    from transformers import Qwen3_5MoeForConditionalGeneration
    src, state = sharded_q35
    model_dir = copy_checkpoint(src, tmp_path / 'model')
    names = mr.shards(model_dir)
    assert len(names) >= 4
    sizes = [os.path.getsize(os.path.join(model_dir, n)) for n in names]
    # short of room by a bit more than the last shard: the last two must move, and no more
    free_where = int(need_bytes(model_dir)) - sizes[-1] - 1
    disks = Disks(model_dir, str(tmp_path / 'spill'), free_where, free_spill=10 * sum(sizes))
    report = mr.make_room(model_dir, str(tmp_path / 'flagship'), disks.spill_dir, free=disks.free,
                          device=disks.device, keep_free_gib=0)
    assert report['moved'] == names[-2:][::-1] and report['room']['fits'], report
    for name in names:
        path = os.path.join(model_dir, name)
        assert os.path.islink(path) == (name in report['moved'])
        if name in report['moved']:
            assert os.path.realpath(path) == os.path.join(os.path.realpath(disks.spill_dir), name)
    assert not [f for f in os.listdir(model_dir) if f.startswith('.')]  # no link left half-made
    loaded = Qwen3_5MoeForConditionalGeneration.from_pretrained(model_dir, torch_dtype=torch.bfloat16)
    got = loaded.state_dict()
    assert set(got) == set(state) and all(torch.equal(got[k], state[k]) for k in state)
    again = mr.make_room(model_dir, str(tmp_path / 'flagship'), disks.spill_dir, free=disks.free,
                         device=disks.device, keep_free_gib=0)
    assert again['moved'] == [] and again['room']['fits'] and again['stale_removed'] == []


def test_nothing_moves_when_the_spill_folder_cannot_take_enough(sharded_q35, tmp_path):
    src, _ = sharded_q35
    model_dir = copy_checkpoint(src, tmp_path / 'model')
    total = mr.weights_bytes(model_dir)
    disks = Disks(model_dir, str(tmp_path / 'spill'), free_where=0, free_spill=total // 2)
    report = mr.make_room(model_dir, str(tmp_path / 'flagship'), disks.spill_dir, free=disks.free,
                          device=disks.device, keep_free_gib=0)
    assert report['moved'] == [] and not report['room']['fits']
    assert disks.spill_dir in report['why_not'] and 'free' in report['why_not']
    assert not any(os.path.islink(os.path.join(model_dir, f)) for f in mr.shards(model_dir))
    assert os.listdir(disks.spill_dir) == []


def test_a_spill_folder_on_the_checkpoints_own_filesystem_is_refused(sharded_q35, tmp_path):
    src, _ = sharded_q35
    model_dir = copy_checkpoint(src, tmp_path / 'model')
    disks = Disks(model_dir, str(tmp_path / 'spill'), free_where=0, free_spill=10 ** 12, same_device=True)
    report = mr.make_room(model_dir, str(tmp_path / 'flagship'), disks.spill_dir, free=disks.free,
                          device=disks.device)
    assert report['moved'] == [] and not report['room']['fits']
    assert "on the checkpoint's filesystem" in report['why_not']


def test_the_spill_folder_keeps_its_reserve(sharded_q35, tmp_path):
    src, _ = sharded_q35
    model_dir = copy_checkpoint(src, tmp_path / 'model')
    total = mr.weights_bytes(model_dir)
    # room for every shard, but not once the reserve is kept
    disks = Disks(model_dir, str(tmp_path / 'spill'), free_where=0, free_spill=2 * total)
    report = mr.make_room(model_dir, str(tmp_path / 'flagship'), disks.spill_dir, free=disks.free,
                          device=disks.device, keep_free_gib=(1.5 * total) / mr.GiB)
    assert report['moved'] == [] and 'kept' in report['why_not']


def test_a_ram_backed_folder_asks_the_hosts_available_ram(sharded_q35, tmp_path):
    src, _ = sharded_q35
    model_dir = copy_checkpoint(src, tmp_path / 'model')
    mounts = tmp_path / 'mounts'
    mounts.write_text(f'/dev/vda / ext4 rw 0 0\ntmpfs {tmp_path} tmpfs rw,size=88080384k 0 0\n')
    need = need_bytes(model_dir)
    reserve = mr.HOST_RESERVE_GIB * mr.GiB
    meminfo = tmp_path / 'meminfo'
    plenty = lambda path: 10 * int(need)  # noqa: E731
    meminfo.write_text(f'MemTotal: 131072000 kB\nMemAvailable: {int((need + reserve) / 1024) - 1} kB\n')
    short = mr.room(model_dir, str(tmp_path / 'flagship'), free=plenty, mounts=str(mounts), meminfo=str(meminfo))
    assert short['filesystem'] == 'tmpfs' and not short['fits'] and 'RAM' in short['why_not']
    meminfo.write_text(f'MemTotal: 131072000 kB\nMemAvailable: {int((need + reserve) / 1024) + 1} kB\n')
    enough = mr.room(model_dir, str(tmp_path / 'flagship'), free=plenty, mounts=str(mounts), meminfo=str(meminfo))
    assert enough['fits'] and enough['ram_available_gib'] is not None
    mounts.write_text('/dev/vda / ext4 rw 0 0\n')  # on a disk the host's RAM is not asked
    disk = mr.room(model_dir, str(tmp_path / 'flagship'), free=plenty, mounts=str(mounts), meminfo=str(tmp_path / 'x'))
    assert disk['fits'] and disk['filesystem'] == 'ext4' and 'ram_available_gib' not in disk


def test_moving_shards_off_a_tmpfs_counts_the_ram_they_free(sharded_q35, tmp_path):
    """The checkpoint's tmpfs has disk-like room but the host is short of RAM: a shard moved off it frees its RAM."""
    src, _ = sharded_q35
    model_dir = copy_checkpoint(src, tmp_path / 'model')
    mounts = tmp_path / 'mounts'
    mounts.write_text(f'tmpfs {model_dir} tmpfs rw 0 0\ntmpfs {tmp_path / "flagship"} tmpfs rw 0 0\n'
                      f'/dev/vda {tmp_path / "spill"} ext4 rw 0 0\n')
    (tmp_path / 'flagship').mkdir()
    need = need_bytes(model_dir)
    size = os.path.getsize(os.path.join(model_dir, mr.shards(model_dir)[-1]))
    disks = Disks(model_dir, str(tmp_path / 'spill'), free_where=10 * int(need), free_spill=10 * int(need))
    meminfo = tmp_path / 'meminfo'
    short_by = size // 2  # less than one shard: moving the last one is enough, for the RAM alone
    meminfo.write_text(f'MemAvailable: {int(need + mr.HOST_RESERVE_GIB * mr.GiB - short_by) // 1024} kB\n')
    report = mr.make_room(model_dir, str(tmp_path / 'flagship'), disks.spill_dir, free=disks.free,
                          device=disks.device, mounts=str(mounts), meminfo=str(meminfo), keep_free_gib=0)
    assert report['moved'] == mr.shards(model_dir)[-1:]


def test_leftovers_of_a_rebuilt_checkpoint_are_removed_from_the_spill_folder(sharded_q35, tmp_path):
    src, _ = sharded_q35
    model_dir = copy_checkpoint(src, tmp_path / 'model')
    spill = tmp_path / 'spill'
    spill.mkdir()
    (spill / 'model-00009-of-00009.safetensors').write_bytes(b'x' * KiB)  # no link points at it
    (spill / 'model-00001-of-00009.safetensors.partial').write_bytes(b'x')  # a copy cut short
    (spill / 'notes.txt').write_text('not ours to remove')
    disks = Disks(model_dir, str(spill), free_where=10 ** 12, free_spill=10 ** 12)
    report = mr.make_room(model_dir, str(tmp_path / 'flagship'), str(spill), free=disks.free, device=disks.device)
    assert sorted(report['stale_removed']) == ['model-00001-of-00009.safetensors.partial',
                                               'model-00009-of-00009.safetensors']
    assert os.listdir(spill) == ['notes.txt'] and report['moved'] == []


def _second_filesystem(near):
    for candidate in ('/dev/shm', os.environ.get('XDG_RUNTIME_DIR') or ''):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK) \
                and os.stat(candidate).st_dev != os.stat(near).st_dev:
            return candidate
    return None


def test_shards_move_to_a_real_second_filesystem(sharded_q35, tmp_path):
    """The copy and the link across two real filesystems (here /dev/shm beside the test's folder)."""
    import tempfile
    src, state = sharded_q35
    other = _second_filesystem(str(tmp_path))
    if other is None or mr.weights_bytes(src) * 3 > __import__('shutil').disk_usage(other).free:
        pytest.skip('this machine has no second writable filesystem with room for the tiny checkpoint')
    model_dir = copy_checkpoint(src, tmp_path / 'model')
    names = mr.shards(model_dir)
    with tempfile.TemporaryDirectory(dir=other) as spill:
        size_last = os.path.getsize(os.path.join(model_dir, names[-1]))
        where_free = int(need_bytes(model_dir)) - size_last + 1  # short by less than one shard
        report = mr.make_room(model_dir, str(tmp_path / 'flagship'), spill, keep_free_gib=0,
                              free=lambda p: (__import__('shutil').disk_usage(p).free if p.startswith(spill)
                                              else where_free + (size_last if os.path.islink(
                                                  os.path.join(model_dir, names[-1])) else 0)))
        assert report['moved'] == [names[-1]] and report['room']['fits']
        from safetensors.torch import load_file
        tensors = load_file(os.path.join(model_dir, names[-1]))
        common = [k for k in tensors if k in state]
        assert common and all(torch.equal(tensors[k], state[k]) for k in common)
