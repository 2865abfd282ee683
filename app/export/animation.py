"""Writing painted frames to a file a customer can take away: an animated GIF (Pillow), an MP4
(PyAV, an optional extra) or a PNG still. Frames come at a fixed rate: a GIF's delays are
hundredths of a second, so each frame lasts ``100 / fps`` of them (5 at 20 fps)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from app.errors import UserError

ANIMATION_SUFFIXES = (".gif", ".mp4")
STILL_SUFFIXES = (".png",)


@dataclass(frozen=True)
class Frame:
    """One painted frame: its RGB rows, 3 bytes a pixel, no padding."""

    width: int
    height: int
    rgb: bytes


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - a declared dependency
        raise UserError("writing GIF and PNG needs Pillow: pip install pillow") from None
    return Image


def _image(frame: Frame) -> Any:
    return _pillow().frombytes("RGB", (frame.width, frame.height), frame.rgb)


def write_still(frame: Frame, path: Path) -> Path:
    _image(frame).save(path, format="PNG")
    return path


def write_animation(frames: Iterable[Frame], path: Path, fps: int) -> Path:
    """``frames`` at ``fps`` to ``path`` (``.gif`` or ``.mp4``)."""
    suffix = path.suffix.lower()
    if suffix == ".gif":
        return _write_gif(frames, path, fps)
    if suffix == ".mp4":
        return _write_mp4(frames, path, fps)
    raise UserError(f"cannot write {path.name}: an animation is {' or '.join(ANIMATION_SUFFIXES)}, "
                    f"a still {' or '.join(STILL_SUFFIXES)}")


def gif_frame_cs(fps: int) -> int:
    """A frame's GIF delay in hundredths of a second: ``fps`` must divide 100 for the animation to
    keep its time."""
    if 100 % fps:
        raise UserError(f"a GIF's frames last whole hundredths of a second: {fps} fps does not divide 100")
    return 100 // fps


def _write_gif(frames: Iterable[Frame], path: Path, fps: int) -> Path:
    delay_cs = gif_frame_cs(fps)
    # One palette for all frames (the first's is a poor fit for what streams in later): an adaptive
    # palette of each frame would flicker. The frames share the theme's few colours, so 256 suffice.
    images = [_image(f).quantize(colors=256, method=2) for f in frames]
    if not images:
        raise UserError("no frames to write")
    images[0].save(path, format="GIF", save_all=True, append_images=images[1:], duration=delay_cs * 10,
                   loop=0, optimize=False, disposal=1)
    return path


def _write_mp4(frames: Iterable[Frame], path: Path, fps: int) -> Path:
    try:
        import av
    except ImportError:
        raise UserError("writing MP4 needs PyAV: pip install 'tunebench[video]' (or write a .gif)") from None
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        first = True
        for k, frame in enumerate(frames):
            if first:  # yuv420p needs even sides
                stream.width, stream.height = frame.width - frame.width % 2, frame.height - frame.height % 2
                first = False
            image = _image(frame).crop((0, 0, stream.width, stream.height))
            video = av.VideoFrame.from_image(image)
            video.pts = k
            for packet in stream.encode(video):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
