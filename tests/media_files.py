"""Small video files for the edit tests, written with PyAV: each frame shows its own index as an 8-bit bar code
(bar b white when bit b of the index is set), so a test can read back exactly which source frames a render holds;
optional AAC sound (a 440 Hz tone) and a start timecode (a QuickTime `tmcd` track)."""
from fractions import Fraction

import numpy as np


def barcode_video(path, frames, rate, size=(64, 48), audio=False, timecode=None):
    import av
    rate = Fraction(rate).limit_denominator(1001)
    width, height = size
    with av.open(str(path), 'w') as container:
        video = container.add_stream('libx264', rate=rate, options={'crf': '10', 'preset': 'ultrafast', 'g': '12'})
        video.width, video.height, video.pix_fmt = width, height, 'yuv420p'
        if timecode:
            video.metadata['timecode'] = timecode
        sound = container.add_stream('aac', rate=48000, layout='stereo') if audio else None
        for k in range(frames):
            image = np.zeros((height, width, 3), np.uint8)
            for bit in range(8):
                if (k >> bit) & 1:
                    image[:, bit * width // 8:(bit + 1) * width // 8] = 255
            frame = av.VideoFrame.from_ndarray(image, format='rgb24')
            frame.pts, frame.time_base = k, 1 / rate
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        if sound is not None:
            total = int(frames / rate * 48000)
            t = np.arange(total) / 48000
            tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
            for start in range(0, total, 1024):
                chunk = np.ascontiguousarray(np.stack([tone[start:start + 1024]] * 2))
                frame = av.AudioFrame.from_ndarray(chunk, format='fltp', layout='stereo')
                frame.sample_rate, frame.pts, frame.time_base = 48000, start, Fraction(1, 48000)
                container.mux(sound.encode(frame))
            container.mux(sound.encode(None))
    return str(path)


def read_barcodes(path):
    """The source frame index each frame of the video at `path` shows."""
    import av
    found = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            image = frame.to_ndarray(format='gray')
            width = image.shape[1]
            found.append(sum(1 << bit for bit in range(8)
                             if image[:, bit * width // 8 + 2:(bit + 1) * width // 8 - 2].mean() > 128))
    return found


def probe(path):
    """(video frames decoded, video seconds from the stream, audio seconds decoded or None)."""
    import av
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        seconds = float(video.duration * video.time_base)
        frames = sum(1 for _ in container.decode(video=0))
    audio = None
    with av.open(str(path)) as container:
        if container.streams.audio:
            stream = container.streams.audio[0]
            audio = float(stream.duration * stream.time_base)
    return frames, seconds, audio
