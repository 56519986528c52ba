"""Stands in for `swift infer` in the fast predict tests: reads `--val_dataset` (an annotation file) as the video_ora
dataset windows it (the SWIFT_VORA_WINDOW / _STRIDE of its environment, through swift_vora.data.windowing, without
loading ms-swift) and writes one result row per clip, in ms-swift's shape, to `--result_path`.

The answer of a clip is FAKE_ANSWERS[`<source id>@<start>`] (a JSON object in the environment; default `[]`).
FAKE_STOP_AFTER=N: exit 1 after writing N rows (a run that fails half-way). FAKE_SEEN=FILE: append the ids asked.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's swift_vora


def main(argv):
    from swift_vora import switches
    from swift_vora.data.windowing import WindowConfig, window_bounds
    args = dict(zip(argv[1::2], argv[2::2])) if argv and argv[0] == 'infer' else {}
    dataset, result = args['--val_dataset'], args['--result_path']
    config = WindowConfig(**{name: switches.read(f'SWIFT_VORA_{name.upper()}') for name in ('window', 'stride')})
    answers = json.loads(os.environ.get('FAKE_ANSWERS', '{}'))
    stop_after = int(os.environ.get('FAKE_STOP_AFTER', '0'))
    with open(dataset) as f:
        videos = [json.loads(line) for line in f if line.strip()]
    if os.environ.get('FAKE_SEEN'):
        with open(os.environ['FAKE_SEEN'], 'a') as f:
            f.write(json.dumps([v['id'] for v in videos]) + '\n')
    rows = []
    for video in videos:
        for start, end in window_bounds(video['duration'], config):
            rows.append({'response': answers.get(f"{video['id']}@{start:g}", '[]'),
                         'chat_template_kwargs': {'video_start': start, 'video_end': end,
                                                  'sample_id': f"{video['id']}@{start:.1f}-{end:.1f}",
                                                  'source_id': video['id']},
                         'videos': [video['video']]})
    print('val_dataset: Dataset({\n    features: [\'messages\'],\n    num_rows: %d\n})' % len(rows), flush=True)
    with open(result, 'a') as f:
        for i, row in enumerate(rows):
            if stop_after and i == stop_after:
                f.flush()
                sys.exit(1)
            f.write(json.dumps(row) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
