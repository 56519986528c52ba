"""The kept clips concatenated into one video file, decoded and encoded with PyAV (FFmpeg's libraries).

Video: H.264 (libx264, CRF 18, yuv420p; MPEG-4 where the FFmpeg build has no libx264) at the first video's frame
rate and size. A clip is the frames [in, out) of its source, counted from the stream's first frame: the frames the
timelines name. A source at another rate is conformed by time (each output frame shows the source frame on screen
at that moment), at another size scaled. Audio: AAC at the first sound's sample rate and layout (mono or stereo),
cut at the same instants as the frames (to the sample) and resampled where a source differs; a clip from a video
without sound is silence of its length, so sound and picture stay together across clips. No audio stream when no
source has sound.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from typing import List, Optional, Sequence

from .timeline import VideoCut

CONTAINERS = {'.mp4': 'mp4', '.m4v': 'mp4', '.mov': 'mov', '.mkv': 'matroska'}


class RenderError(ValueError):
    """A source that fails to decode while rendering; names the file and the clip."""


@dataclass
class RenderResult:
    path: str
    frames: int
    rate: Fraction
    width: int
    height: int
    audio_samples: int
    sample_rate: Optional[int]

    @property
    def seconds(self) -> float:
        return self.frames / float(self.rate)


def container_format(path: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in CONTAINERS:
        raise ValueError(f'{path}: a rendered cut is written as {", ".join(sorted(CONTAINERS))}')
    return CONTAINERS[suffix]


def render(cuts: Sequence[VideoCut], target: str, write_to: Optional[str] = None) -> RenderResult:
    """Render every kept clip of `cuts`, in order, into a video file named `target` (its suffix chooses the
    container), written at `write_to` (a staged temporary file; default `target`)."""
    import av
    clips = [(cut, first, last) for cut in cuts for first, last in cut.frames]
    if not clips:
        raise ValueError('nothing to render: no clip is kept')
    lead = clips[0][0].media
    rate = lead.rate
    width, height = lead.width - lead.width % 2, lead.height - lead.height % 2  # 4:2:0 needs even sizes
    sound = next((cut.media for cut in cuts if cut.media.has_audio), None)
    with av.open(write_to or target, 'w', format=container_format(target)) as out:
        vstream = _video_stream(out, rate)
        vstream.width, vstream.height, vstream.pix_fmt = width, height, 'yuv420p'
        audio = _AudioOut(out, sound.path) if sound is not None else None
        written = 0
        for cut, first, last in clips:
            count = _frames_at(rate, cut.media.rate, last - first)
            try:
                for frame in _video_frames(cut.media.path, cut.media.rate, first, count, rate):
                    frame = frame.reformat(width=width, height=height, format='yuv420p')
                    frame.pts, frame.time_base = written, 1 / rate
                    out.mux(vstream.encode(frame))
                    written += 1
                if audio is not None:
                    audio.add(cut.media.path if cut.media.has_audio else None, first / cut.media.rate,
                              written / rate)
            except av.error.FFmpegError as exc:  # a source damaged past its header
                raise RenderError(f'{cut.media.path} (line {cut.line}): cannot be decoded in frames {first}-{last} '
                                  f'({exc})') from None
        out.mux(vstream.encode(None))
        samples = audio.finish() if audio is not None else 0
    return RenderResult(path=target, frames=written, rate=rate, width=width, height=height, audio_samples=samples,
                        sample_rate=audio.rate if audio is not None else None)


def _video_stream(container, rate: Fraction):
    """H.264 through libx264 (PyAV's wheels carry it); MPEG-4 Part 2 where an FFmpeg build has no libx264."""
    import av
    try:
        av.codec.Codec('libx264', 'w')
    except av.error.FFmpegError:
        return container.add_stream('mpeg4', rate=rate, options={'qscale': '2'})
    return container.add_stream('libx264', rate=rate, options={'crf': '18', 'preset': 'veryfast'})


def _frames_at(out_rate: Fraction, source_rate: Fraction, source_frames: int) -> int:
    """Output frames for `source_frames` frames of a source at `source_rate` (the same number at the same rate)."""
    return int(Fraction(source_frames) * out_rate / source_rate + Fraction(1, 2))


def _video_frames(path: str, source_rate: Fraction, first: int, count: int, out_rate: Fraction):
    """`count` frames for output times first/source_rate + j/out_rate: the source frame on screen at each (frame k
    of the source is on screen from its start, k/source_rate after the stream's first frame)."""
    import av
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = 'AUTO'
        origin = stream.start_time or 0
        base = stream.time_base
        start = Fraction(first) / source_rate
        container.seek(origin + int(start / base), stream=stream, backward=True)
        decoded = container.decode(stream)
        shown, upcoming = None, None
        for j in range(count):
            want = first + int(Fraction(j) * source_rate / out_rate)  # the source frame on screen at output frame j
            while True:
                if upcoming is None:
                    upcoming = next(decoded, None)
                    if upcoming is None:
                        break  # the stream ended early: the last frame stays on screen
                if _index(upcoming, origin, base, source_rate) > want:
                    break
                shown, upcoming = upcoming, None
            if shown is None:  # the seek landed after the wanted frame (no earlier keyframe): the first one decoded
                shown, upcoming = upcoming, None
            if shown is None:
                raise RenderError(f'{path}: no video frame could be decoded from frame {first}')
            yield shown


def _index(frame, origin: int, base: Fraction, rate: Fraction) -> int:
    pts = frame.pts if frame.pts is not None else origin
    return int((Fraction(pts - origin) * base * rate) + Fraction(1, 2))


class _AudioOut:
    """The audio stream of the render: sources resampled to one format, cut at the frames' instants, encoded in
    the encoder's frame size."""

    def __init__(self, container, lead_path: str):
        import av
        with av.open(lead_path) as source:
            stream = source.streams.audio[0]
            self.rate = int(stream.codec_context.sample_rate or stream.rate or 48000)
            layout = stream.codec_context.layout.name if stream.codec_context.layout else 'stereo'
        self.layout = layout if layout in ('mono', 'stereo') else 'stereo'
        self.stream = container.add_stream('aac', rate=self.rate, layout=self.layout)
        self.container = container
        self.fifo = av.AudioFifo()
        self.written = 0  # samples handed to the encoder
        self.queued = 0  # samples written into the fifo

    def add(self, path: Optional[str], start_seconds: Fraction, until_seconds: Fraction) -> None:
        """Sound from `path` (None: silence) starting `start_seconds` into its video, up to `until_seconds` of the
        render (the end of the clip's last frame)."""
        need = int(until_seconds * self.rate + Fraction(1, 2)) - self.queued
        if need <= 0:
            return
        got = self._source(path, start_seconds, need) if path is not None else 0
        if got < need:
            self._push(_silence(need - got, self.layout))

    def _source(self, path: str, start_seconds: Fraction, need: int) -> int:
        import av
        import numpy as np
        got = 0
        with av.open(path) as container:
            video, stream = container.streams.video[0], container.streams.audio[0]
            # the frames' instants are counted from the video stream's first frame: the same instant in the audio
            start = Fraction(video.start_time or 0) * video.time_base + start_seconds
            container.seek(int(max(Fraction(0), start - Fraction(1, 2)) / stream.time_base), stream=stream,
                           backward=True)
            resampler = av.AudioResampler(format='fltp', layout=self.layout, rate=self.rate)
            position = None  # the time of the next resampled sample
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                for chunk in resampler.resample(frame):
                    if position is None:
                        position = Fraction(frame.pts) * stream.time_base
                    samples = chunk.to_ndarray()
                    offset = int((start - position) * self.rate + Fraction(1, 2))
                    position += Fraction(samples.shape[1], self.rate)
                    if offset >= samples.shape[1]:
                        continue
                    if offset < 0 and got == 0:  # the sound starts after the cut: silence up to it
                        lead = min(-offset, need)
                        self._push(_silence(lead, self.layout))
                        got += lead
                        offset = 0
                    piece = samples[:, max(0, offset):max(0, offset) + need - got]
                    if piece.shape[1]:
                        self._push(np.ascontiguousarray(piece))
                        got += piece.shape[1]
                    if got >= need:
                        return got
        return got

    def _push(self, samples) -> None:
        import av
        frame = av.AudioFrame.from_ndarray(samples, format='fltp', layout=self.layout)
        frame.sample_rate = self.rate
        frame.pts = None
        self.fifo.write(frame)
        self.queued += samples.shape[1]
        size = self.stream.codec_context.frame_size or 1024
        while self.fifo.samples >= size:
            self._encode(self.fifo.read(size))

    def _encode(self, frame) -> None:
        frame.pts, frame.time_base = self.written, Fraction(1, self.rate)
        self.written += frame.samples
        self.container.mux(self.stream.encode(frame))

    def finish(self) -> int:
        if self.fifo.samples:
            self._encode(self.fifo.read())
        self.container.mux(self.stream.encode(None))
        return self.written


def _silence(samples: int, layout: str):
    import numpy as np
    return np.zeros((1 if layout == 'mono' else 2, samples), dtype=np.float32)


def kept_frames(cuts: Sequence[VideoCut]) -> List[int]:
    return [last - first for cut in cuts for first, last in cut.frames]
