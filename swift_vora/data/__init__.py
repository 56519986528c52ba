"""Annotations -> validated, windowed training rows (nothing heavy is imported here).

- `annotations`: the JSONL annotation format; every line validated, every problem located.
- `probe`: video duration and decodability (decord, OpenCV fallback).
- `windowing`: clips of a video and each clip's events in clip time.
- `qvhighlights`: recognising QVHighlights lines and mapping them onto our format.
- `convert`: a QVHighlights file rewritten in our format (`data convert-qvhighlights`).
- `rows`: ms-swift rows and the `data build` pipeline.
- `cli`: `swift-vora data check | build | convert-qvhighlights`.
"""
