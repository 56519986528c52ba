"""`swift-vora cut`: prediction lines -> OpenTimelineIO timelines written and read back by OTIO's own adapters, an
EDL checked line by line, a render probed frame by frame, the editing rules, and inputs that must stop the cut with
the line named and nothing written."""
import json
from fractions import Fraction

import opentimelineio as otio
import pytest
from cli_harness import assert_clean, run_cli
from media_files import barcode_video, probe, read_barcodes

from swift_vora.edit.timeline import CutRules, kept_ranges, reel_names, to_frames

NTSC = Fraction(30000, 1001)


def write_lines(path, rows):
    path.write_text(''.join(json.dumps(row) + '\n' for row in rows))
    return path


def line(video_id, video, duration, windows):
    return {'id': video_id, 'video': str(video), 'duration': duration, 'windows': windows}


@pytest.fixture(scope='module')
def media(tmp_path_factory):
    """match_07.mp4: 10 s at 25 fps with sound and timecode 01:00:00:00; quiet.mp4: 4 s at 25 fps without sound;
    ntsc.mov: 63 s at 29.97 fps (30000/1001)."""
    folder = tmp_path_factory.mktemp('media')
    files = {'match': barcode_video(folder / 'match_07.mp4', 250, 25, audio=True, timecode='01:00:00:00'),
             'quiet': barcode_video(folder / 'quiet.mp4', 100, 25),
             'ntsc': barcode_video(folder / 'ntsc.mov', 1890, NTSC, size=(32, 16)),
             'folder': folder}
    data = open(files['match'], 'rb').read()
    (folder / 'truncated.mp4').write_bytes(data[:len(data) // 2])  # a copy cut off: its index is at the end
    files['truncated'] = str(folder / 'truncated.mp4')
    return files


# ---- the rules ----------------------------------------------------------------------------------------------------
def test_padding_joins_windows_and_short_clips_are_dropped_and_counted():
    rules = CutRules(pad=0.5, merge_gap=1.0, min_clip=1.0)
    # [1,2] and [2.5,4] overlap once padded; [6.2,6.4] pads to [5.7, 6.9], 1.2 s past 4.5: apart, 1.2 s long;
    # [9.9, 10] pads to [9.4, 10] (the end of the video): 0.6 s, dropped
    clips, joined, dropped = kept_ranges([[1, 2], [2.5, 4], [6.2, 6.4], [9.9, 10]], 10.0, rules)
    assert clips == [(0.5, 4.5), (pytest.approx(5.7), pytest.approx(6.9))] and joined == 1 and dropped == 1
    # a gap of exactly merge_gap joins; no padding and no minimum keep the windows as they are
    assert kept_ranges([[0, 1], [2, 3]], 10, CutRules(0, 1.0, 0)) == ([(0, 3)], 1, 0)
    assert kept_ranges([[0, 1], [2.5, 3]], 10, CutRules(0, 1.0, 0)) == ([(0, 1), (2.5, 3)], 0, 0)


def test_cuts_land_on_the_nearest_frame_halves_going_up():
    assert to_frames([(0.02, 0.06)], 25, 250) == [(1, 2)]  # 0.5 -> 1, 1.5 -> 2
    assert to_frames([(0.0, 0.019)], 25, 250) == []  # less than half a frame keeps nothing
    assert to_frames([(9.5, 11.0)], 25, 250) == [(238, 250)]  # never past the last frame
    assert to_frames([(1.0, 2.0), (2.01, 3.0)], 25, 250) == [(25, 75)]  # snapped to touch: one clip


def test_reels_are_unique_within_eight_letters_and_digits():
    reels = reel_names(['/a/match_07.mp4', '/b/match_07.mov', '/c/long-name-of-a-camera-file.mxf', '/a/match_07.mp4'])
    assert list(reels.values()) == ['match07', 'match071', 'longname']
    # a number never gives a file the name another file has by itself: an editor relinks by reel and timecode
    reels = reel_names(['A001C002_0101.mp4', 'A001C002_0102.mp4', 'A001C001_0101.mp4', 'A001C00a.mp4'])
    assert reels == {'A001C002_0101.mp4': 'A001C002', 'A001C002_0102.mp4': 'A001C003',
                     'A001C001_0101.mp4': 'A001C001', 'A001C00a.mp4': 'A001C00a'}


# ---- the formats, read back with OpenTimelineIO ---------------------------------------------------------------------
def test_otio_and_fcp_xml_round_trip_the_frames_at_the_videos_rate(tmp_path, media):
    preds = write_lines(tmp_path / 'p.jsonl', [line('match_07', media['match'], 10.0, [[1.0, 2.0], [2.5, 4.0],
                                                                                         [8.0, 8.3]]),
                                               line('quiet', media['quiet'], 4.0, [[0.0, 1.5]])])
    rc, out, err = run_cli('cut', preds, '--to', 'otio', '--to', 'fcp_xml', '--output_dir', tmp_path / 'cut', '--json')
    assert_clean(rc, out, err, ['--json'])
    assert rc == 0, err
    report = json.loads(out)
    assert report['files'] == [str(tmp_path / 'cut' / 'highlights.otio'), str(tmp_path / 'cut' / 'highlights.xml')]
    # defaults: pad 0.5, gap 1, min 1 -> match: [0.5, 4.5] + [7.5, 8.8], quiet: [0, 2.0]; 25 fps, halves up
    hour = 90000  # 01:00:00:00 at 25 fps: the file's timecode is where its source times start
    expected = [(hour + 13, 100), (hour + 188, 32), (0 + 0, 50)]
    for path, adapter in ((tmp_path / 'cut' / 'highlights.otio', None), (tmp_path / 'cut' / 'highlights.xml',
                                                                         'fcp_xml')):
        timeline = otio.adapters.read_from_file(str(path), adapter_name=adapter)
        video = [t for t in timeline.tracks if t.kind == otio.schema.TrackKind.Video][0]
        clips = list(video.find_clips())
        assert [(c.source_range.start_time.value, c.source_range.duration.value) for c in clips] == expected, path
        assert {c.source_range.start_time.rate for c in clips} == {25.0}
        assert [c.media_reference.target_url for c in clips] == [
            otio.url_utils.url_from_filepath(media['match'])] * 2 + [otio.url_utils.url_from_filepath(media['quiet'])]
        assert clips[0].media_reference.available_range.start_time.value == hour
        assert video.range_of_child_at_index(2).start_time.value == 132  # back to back on the record side
        audio = [t for t in timeline.tracks if t.kind == otio.schema.TrackKind.Audio]
        assert len(audio) == 1  # one source has sound: A1 holds its clips, a gap where the other has none
        sound = list(audio[0].find_clips())
        assert [(c.source_range.start_time.value, c.source_range.duration.value) for c in sound] == expected[:2]
        if adapter is None:  # FCP XML leaves a track's trailing gap out
            assert audio[0].duration().value == 182
    saved = otio.adapters.read_from_file(str(tmp_path / 'cut' / 'highlights.otio'))
    first = next(iter(saved.find_clips()))
    origin = first.metadata['swift_vora']  # OTIO's AnyDictionary / AnyVector
    assert (origin['id'], list(origin['seconds']), origin['line']) == ('match_07', [0.5, 4.5], 1)
    # the contract's spelling of the same format, given twice over: one file, the same timeline
    rc, out, err = run_cli('cut', preds, '--to', 'fcpxml', '--to', 'fcp_xml', '--output_dir', tmp_path / 'again',
                           '--json')
    assert rc == 0 and json.loads(out)['files'] == [str(tmp_path / 'again' / 'highlights.xml')], err
    assert (tmp_path / 'again' / 'highlights.xml').read_bytes() == (tmp_path / 'cut' / 'highlights.xml').read_bytes()


def test_the_edl_line_by_line(tmp_path, media):
    preds = write_lines(tmp_path / 'p.jsonl', [line('match_07', media['match'], 10.0, [[1.0, 2.0], [2.5, 4.0],
                                                                                         [8.0, 8.3]])])
    rc, out, err = run_cli('cut', preds, '--to', 'edl', '--output_dir', tmp_path / 'cut')
    assert rc == 0, err
    url = otio.url_utils.url_from_filepath(media['match'])
    assert (tmp_path / 'cut' / 'highlights.edl').read_text().splitlines() == [
        'TITLE: highlights',
        'FCM: NON-DROP FRAME',
        '',
        '001  match07  V     C        01:00:00:13 01:00:04:13 00:00:00:00 00:00:04:00',
        '* FROM CLIP NAME:  match_07.mp4',
        f'* FROM CLIP: {url}',
        '002  match07  V     C        01:00:07:13 01:00:08:20 00:00:04:00 00:00:05:07',
        '* FROM CLIP NAME:  match_07.mp4',
        f'* FROM CLIP: {url}',
    ]
    back = otio.adapters.read_from_file(str(tmp_path / 'cut' / 'highlights.edl'), rate=25)
    assert [(c.source_range.start_time.value, c.source_range.duration.value) for c in back.find_clips()] == [
        (90013, 100), (90188, 32)]


def test_an_ntsc_edl_is_in_drop_frame_timecode(tmp_path, media):
    # 61-62 s at 30000/1001: frames 1828..1858 (61 x 29.97 = 1828.2, 62 x 29.97 = 1858.1); in drop-frame timecode
    # minute 1 starts at ;02, so frame 1828 is 00:01:01;00
    preds = write_lines(tmp_path / 'p.jsonl', [line('ntsc', media['ntsc'], 63.0, [[61.0, 62.0]])])
    rc, out, err = run_cli('cut', preds, '--to', 'edl', '--to', 'fcp_xml', '--pad', '0', '--output_dir',
                           tmp_path / 'cut')
    assert rc == 0, err
    events = [text for text in (tmp_path / 'cut' / 'highlights.edl').read_text().splitlines() if text[:3] == '001']
    assert events == ['001  ntsc     V     C        00:01:01;00 00:01:02;00 00:00:00;00 00:00:01;00']
    assert (tmp_path / 'cut' / 'highlights.edl').read_text().splitlines()[1] == 'FCM: DROP FRAME'
    back = otio.adapters.read_from_file(str(tmp_path / 'cut' / 'highlights.edl'), rate=float(NTSC))
    assert [(c.source_range.start_time.value, c.source_range.duration.value) for c in back.find_clips()] == [
        (1828, 30)]
    xml = otio.adapters.read_from_file(str(tmp_path / 'cut' / 'highlights.xml'))
    clip = next(iter(xml.find_clips()))
    assert clip.source_range.start_time.value == 1828 and clip.source_range.duration.value == 30
    assert clip.source_range.start_time.rate == pytest.approx(float(NTSC))


# ---- the render ---------------------------------------------------------------------------------------------------
def test_the_render_holds_exactly_the_kept_frames_with_sound(tmp_path, media):
    preds = write_lines(tmp_path / 'p.jsonl', [
        line('match_07', media['match'], 10.0, [[1.0, 2.0], [8.0, 8.3]]),
        line('quiet', media['quiet'], 4.0, [[2.0, 3.0]]),  # no sound: silence of its length keeps the sync
        line('ntsc', media['ntsc'], 63.0, [[10.0, 11.0]]),  # 29.97 fps into a 25 fps render: conformed by time
    ])
    target = tmp_path / 'out' / 'highlights.mp4'
    rc, out, err = run_cli('cut', preds, '--pad', '0', '--min-clip', '0', '--render', target, '--output_dir',
                           tmp_path / 'cut', '--json')
    assert rc == 0, err
    frames, seconds, audio = probe(target)
    ntsc_first = round(10 * float(NTSC))  # 300: 299.7 rounds up
    ntsc_frames = round(11 * float(NTSC)) - ntsc_first  # 330 - 300
    conformed = round(ntsc_frames * 25 / float(NTSC))  # 25 output frames for 30 source frames
    expected = (list(range(25, 50)) + list(range(200, 208)) + list(range(50, 75))
                + [(ntsc_first + int(j * NTSC / 25)) % 256 for j in range(conformed)])
    assert read_barcodes(target) == expected
    assert frames == len(expected) == json.loads(out)['render']['frames']
    assert seconds == pytest.approx(len(expected) / 25)
    assert audio == pytest.approx(seconds, abs=0.05)  # sound for every clip, the silent ones included


def test_a_render_without_any_sound_has_no_audio_stream(tmp_path, media):
    preds = write_lines(tmp_path / 'p.jsonl', [line('quiet', media['quiet'], 4.0, [[1.0, 2.0]])])
    rc, out, err = run_cli('cut', preds, '--pad', '0', '--render', tmp_path / 'h.mov', '--output_dir', tmp_path)
    assert rc == 0, err
    assert probe(tmp_path / 'h.mov') == (25, pytest.approx(1.0), None)
    assert read_barcodes(tmp_path / 'h.mov') == list(range(25, 50))


# ---- inputs that cannot be cut: the line named, nothing written -----------------------------------------------------
@pytest.mark.parametrize('row, message', [
    (lambda m: line('x', m['folder'] / 'missing.mp4', 10.0, []), "p.jsonl:2: field 'video': "),
    (lambda m: line('x', m['truncated'], 10.0, []), 'truncated.mp4: cannot be opened as a video'),
    (lambda m: line('x', m['match'], 10.0, [[5.0, 70.0]]), "p.jsonl:2: field 'windows'[0]: end 70.0 is past the "
                                                            'duration 10.0'),
    (lambda m: line('x', m['match'], 10.0, [[5.0, 2.0]]), "p.jsonl:2: field 'windows'[0]: start 5.0 >= end 2.0"),
    (lambda m: line('x', m['match'], 60.0, []), "p.jsonl:2: field 'duration': 60 s is longer than the video"),
    (lambda m: {'id': 'x', 'video': str(m['match']), 'windows': []}, "p.jsonl:2: field 'duration': missing"),
    (lambda m: line('quiet', m['quiet'], 4.0, []), "p.jsonl:2: field 'id': 'quiet' again (first on line 1)"),
    (lambda m: '{"id": "x", "video": ', 'p.jsonl:2: not valid JSON'),
])
def test_a_line_that_cannot_be_cut_is_named_and_nothing_is_written(tmp_path, media, row, message):
    bad = row(media)
    (tmp_path / 'p.jsonl').write_text(json.dumps(line('quiet', media['quiet'], 4.0, [[1.0, 2.0]])) + '\n'
                                      + (bad if isinstance(bad, str) else json.dumps(bad)) + '\n')
    argv = ['cut', tmp_path / 'p.jsonl', '--to', 'otio', '--to', 'edl', '--render', tmp_path / 'h.mp4',
            '--output_dir', tmp_path / 'cut']
    rc, out, err = run_cli(*argv)
    assert_clean(rc, out, err, argv)
    assert rc == 1 and message in err and 'nothing written' in err, err
    assert not (tmp_path / 'cut').exists() and not (tmp_path / 'h.mp4').exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['p.jsonl']  # no temporary file left either


def test_an_edl_of_more_than_999_clips_is_refused_and_per_video_or_otio_offered(tmp_path, media):
    rows = [line(f'q{i}', media['quiet'], 4.0, [[1.0, 2.0]]) for i in range(1000)]
    preds = write_lines(tmp_path / 'p.jsonl', rows)
    rc, out, err = run_cli('cut', preds, '--to', 'edl', '--output_dir', tmp_path / 'cut')
    assert rc == 1 and 'numbers its events 001-999; this timeline has 1000 clips' in err and '--per-video' in err
    assert not (tmp_path / 'cut').exists()
    write_lines(tmp_path / 'p.jsonl', rows[:999])
    rc, out, err = run_cli('cut', preds, '--to', 'edl', '--output_dir', tmp_path / 'cut')
    assert rc == 0, err
    assert (tmp_path / 'cut' / 'highlights.edl').read_text().count('\n999  ') == 1


def test_a_name_with_a_newline_is_a_usage_error(tmp_path, media):
    preds = write_lines(tmp_path / 'p.jsonl', [line('quiet', media['quiet'], 4.0, [[1.0, 2.0]])])
    rc, out, err = run_cli('cut', preds, '--to', 'edl', '--name', 'day1\n001  X', '--output_dir', tmp_path / 'cut')
    assert rc == 2 and 'without control characters' in err and not (tmp_path / 'cut').exists()


def test_a_format_that_cannot_hold_the_rate_is_refused_naming_the_video(tmp_path, media):
    from swift_vora.synthetic import write_video
    four = write_video(str(tmp_path / 'four.mp4'), 8.0, [(1, 3)], fps=4.0, size=(32, 24))
    preds = write_lines(tmp_path / 'p.jsonl', [line('four', four, 8.0, [[1.0, 3.0]]),
                                               line('quiet', media['quiet'], 4.0, [[1.0, 2.0]])])
    rc, out, err = run_cli('cut', preds, '--to', 'edl', '--output_dir', tmp_path / 'cut')
    assert rc == 1 and 'one frame rate per timeline' in err and '--per-video' in err
    rc, out, err = run_cli('cut', preds, '--to', 'edl', '--per-video', '--output_dir', tmp_path / 'cut')
    assert rc == 1 and 'SMPTE timecode' in err and 'four (line 1' in err and '4 fps' in err, err
    assert not (tmp_path / 'cut').exists()
    rc, out, err = run_cli('cut', preds, '--to', 'fcp_xml', '--per-video', '--output_dir', tmp_path / 'cut')
    assert rc == 1 and 'Final Cut Pro 7 XML counts frames in SMPTE timecode' in err
    rc, out, err = run_cli('cut', preds, '--to', 'otio', '--per-video', '--output_dir', tmp_path / 'cut')
    assert rc == 0, err  # .otio keeps 4 fps
    clip = next(iter(otio.adapters.read_from_file(str(tmp_path / 'cut' / 'four.otio')).find_clips()))
    assert clip.source_range.start_time.rate == 4 and clip.source_range.duration.value == 12  # [0.5, 3.5] s


def test_nothing_kept_and_bad_paths(tmp_path, media):
    preds = write_lines(tmp_path / 'p.jsonl', [line('quiet', media['quiet'], 4.0, [[1.0, 1.2]])])
    rc, out, err = run_cli('cut', preds, '--pad', '0', '--output_dir', tmp_path / 'cut')
    assert rc == 1 and 'nothing to cut' in err and not (tmp_path / 'cut').exists()
    rc, out, err = run_cli('cut', preds, '--render', tmp_path / 'h.avi')
    assert rc == 2 and '.mkv' in err
    rc, out, err = run_cli('cut', tmp_path / 'absent.jsonl')
    assert rc == 2 and 'absent.jsonl' in err


def test_a_phone_file_that_dropped_frames_is_cut_at_its_nominal_rate(tmp_path):
    import av
    import numpy as np

    from swift_vora.edit.media import read_media
    path = tmp_path / 'phone.mp4'
    with av.open(str(path), 'w') as out:  # 30 fps for 20 s with three frames dropped, as a phone under load writes
        stream = out.add_stream('libx264', rate=30)
        stream.width, stream.height, stream.pix_fmt = 32, 24, 'yuv420p'
        stream.codec_context.time_base = stream.time_base = Fraction(1, 30000)
        for i in range(600):
            if i not in (100, 300, 450):
                frame = av.VideoFrame.from_ndarray(np.zeros((24, 32, 3), np.uint8), format='rgb24')
                frame.pts, frame.time_base = i * 1000, Fraction(1, 30000)
                out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    media = read_media(str(path))
    assert (media.rate, media.average_rate, media.frames) == (30, Fraction(597, 20), 600)
    preds = write_lines(tmp_path / 'p.jsonl', [line('phone', path, 20.0, [[10.0, 12.0]])])
    rc, out, err = run_cli('cut', preds, '--to', 'edl', '--to', 'fcp_xml', '--pad', '0', '--output_dir',
                           tmp_path / 'cut')
    assert rc == 0 and 'variable frame rate (29.85 fps on average): cut at its nominal 30 fps' in out, err
    back = otio.adapters.read_from_file(str(tmp_path / 'cut' / 'highlights.edl'), rate=30)
    assert [(c.source_range.start_time.value, c.source_range.duration.value) for c in back.find_clips()] == [
        (300, 60)]
