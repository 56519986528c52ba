"""`swift-vora cut`: prediction lines -> an edit: OpenTimelineIO timelines, the formats editors open, a render.

- `media`: what the cut needs from each video file (frame rate, frames, start timecode, audio), read with PyAV.
- `timeline`: the editing rules (padding, joining short gaps, dropping short clips, cutting on the nearest
  frame) and the OpenTimelineIO timeline of the kept clips.
- `formats`: the timeline written by OpenTimelineIO's own adapters: `.otio`, Final Cut Pro 7 XML, CMX 3600 EDL.
- `render`: the kept clips concatenated into one video file with PyAV (audio kept where a source has it).
- `cli`: the command.
"""
