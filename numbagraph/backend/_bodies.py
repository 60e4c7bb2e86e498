"""What both backends' conditional nodes share: which body is open."""

from __future__ import annotations

from typing import Any


class BodyTracking:
    """A conditional node's open body: what resumes the enclosing capture
    (``_saved``), and its place among the recording's open bodies."""

    __slots__ = ("_recording", "_saved")

    def __init__(self, recording: Any):
        self._recording = recording
        self._saved: Any = None

    def _opened(self, saved: Any) -> None:
        self._saved = saved
        self._recording.open_bodies.append(self)

    def _close(self) -> Any:
        """What resumes the enclosing capture (None if no body is open); the
        body no longer counts as open."""
        saved, self._saved = self._saved, None
        if self in self._recording.open_bodies:
            self._recording.open_bodies.remove(self)
        return saved
