"""One decoder thread per video reader: the DataLoader workers are the parallelism, not ffmpeg's threads.

qwen_vl_utils opens every training video with `decord.VideoReader(path)`, whose default `num_threads=0` lets
ffmpeg start a decoding thread per core. With N DataLoader workers that is N x cores threads on the machine; they
compete with the trainer's own threads, which after regional compilation are what limits a step. Single-threaded
decoding also costs less CPU per clip (docs/runs/benchmarks-log.md has both measurements).

Narrow patch: `decord.VideoReader` is replaced by a subclass whose `num_threads` defaults to
`SWIFT_VORA_DECODE_THREADS` (default 1; 0 = decord's own default, i.e. no patch). Explicit `num_threads=` arguments
are kept. Applied in the process that decodes (the template's video path), once per process.
"""
from __future__ import annotations

from .. import patches, switches

ENV = 'SWIFT_VORA_DECODE_THREADS'
PATCH = 'decoder_threads'  # swift_vora/patches.py


def decoder_threads(environ=None) -> int:
    return switches.read(ENV, environ)


def limit_decord_threads(environ=None) -> int:
    """Make `decord.VideoReader(path)` use `decoder_threads()` threads; returns that number (0: untouched)."""
    threads = decoder_threads(environ)
    import decord
    current = decord.VideoReader
    original = patches.upstream(current)
    if threads == 0:
        decord.VideoReader = original
        return 0
    if patches.patched_by(current) == PATCH and current.default_threads == threads:
        return threads
    if not patches.applicable(PATCH):
        return 0

    class VideoReader(original):
        __doc__ = original.__doc__
        default_threads = threads

        def __init__(self, uri, *args, **kwargs):
            if len(args) < 3:  # num_threads is the 4th parameter after uri: (ctx, width, height, num_threads)
                kwargs.setdefault('num_threads', threads)
            super().__init__(uri, *args, **kwargs)

    VideoReader.__name__ = VideoReader.__qualname__ = original.__name__
    decord.VideoReader = patches.mark(VideoReader, PATCH, original)
    return threads
