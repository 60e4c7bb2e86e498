"""Several streams in one capture: the streams forked into a capture, whether
each is joined back, and the rules CUDA sets for them.

CUDA's rule: while a stream captures, another stream made to wait on an
event recorded on it joins the capture ("forks" into it): its work is
recorded into the same graph, after the work the event stood for, in
parallel with the work of the stream it forked from. The capture ends only
once every such stream is joined back: its work waited on by the capture's
own stream, directly or through another stream that is joined back in turn
(else ``CUDA_ERROR_STREAM_CAPTURE_UNJOINED``).

What numbagraph keeps of it, on the capture's :class:`~numbagraph._registry.Session`
(``forks``) and in the events recorded in it (``events``): each event
recorded on a stream of a capture stands for a :class:`Mark` (that stream,
its work then as the backend's ``capture_frontier`` says, the capture's
restart count); a wait on it forks the waiting stream in, or records that
the stream the event was recorded on is joined into the waiting one. A
forked stream is joined back when its work now is what it was when it was
last joined into a stream, and that stream is the capture's own or joined
back itself; a stream forked in and never joined back is not, even with no
work of its own. The check runs as the capture ends (before the driver's
own), and before a conditional block ends and begins the capture again,
which the driver does on the capture's own stream alone: streams forked in
leave the capture there.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from . import _registry
from ._registry import Fork, Session, key_of
from .backend import active as _backend
from .errors import ConditionalError, ForeignStreamInCaptureError

__all__ = ["Mark", "mark", "waited", "unjoined", "names", "guard_restart", "restarted",
           "settle"]


class Mark(NamedTuple):
    """What an event recorded in a capture stands for."""

    key: Any
    """The capture key of the stream it was recorded on."""
    frontier: Any
    """That stream's work then (the backend's ``capture_frontier``)."""
    restarts: int
    """The capture's ``restarts`` then: after a conditional block began the
    capture again, the event cannot be waited on."""


def mark(session: Session, handle: int) -> Mark:
    """What an event recorded now on the stream ``handle``, of ``session``,
    stands for."""
    return Mark(key_of(handle), _backend.capture_frontier(handle), session.restarts)


def waited(session: Session, stream: Any, handle: int, at: Mark) -> None:
    """The stream ``handle`` (``stream``) waited on the work ``at`` stands
    for, in ``session``: it is in the capture from now on (forked into it
    if it was not), and the stream ``at`` was recorded on is joined into it.
    Call once the wait is made."""
    key = key_of(handle)
    if key == at.key:
        return  # a stream waiting on its own work
    if key != session.key and key not in session.forks:
        checks = session.recording.finish_checks
        if not any(getattr(c, "func", None) is _check_joined for c in checks):
            checks.append(functools.partial(_check_joined, session))
        _registry.add_fork(session, stream, handle)
    _backend.stream_waited(session.recording, handle, at.frontier)
    joined = session.forks.get(at.key)
    if joined is not None:
        joined.join = (key, at.frontier)


def unjoined(session: Session) -> list[Fork]:
    """The streams forked into ``session`` that are not joined back now;
    none while the capture's own stream does not capture (its capture
    ended, or was invalidated: the driver says why)."""
    forks = session.forks
    if not forks or _backend.capture_frontier(session.handle) is None:
        return []
    now = {key: _backend.capture_frontier(fork.handle) for key, fork in forks.items()}

    def joined(key: Any, seen: frozenset) -> bool:
        if key == session.key:
            return True
        fork = forks.get(key)
        if fork is None or fork.join is None or key in seen:
            return False
        into, frontier = fork.join
        return now[key] == frontier and joined(into, seen | {key})

    return [fork for key, fork in forks.items() if not joined(key, frozenset())]


def names(forks: list[Fork]) -> str:
    """The streams of ``forks``, for messages."""
    return ", ".join(repr(fork.stream) for fork in forks)


def _check_joined(session: Session) -> None:
    """Run as the capture ends: every forked stream is joined back."""
    left = unjoined(session)
    if left:
        many = len(left) > 1
        raise ForeignStreamInCaptureError(
            f"the capture on {session.stream!r} ended while {names(left)}, forked into "
            f"it, {'were' if many else 'was'} not joined back: nothing on its own stream "
            f"waits for {'their' if many else 'its'} work since the fork, and CUDA ends "
            "no capture so (CUDA_ERROR_STREAM_CAPTURE_UNJOINED). Instead, "
            "join each forked stream back before the capture ends: leave its "
            "`with ng.fork(...)` block, or record an event on it after its last work "
            f"and make {session.stream!r} wait on it (ev.record(s2); ev.wait(s)). The "
            "capture was ended and its graph discarded; the streams are usable and a "
            "new capture may begin")


def guard_restart(session: Session, what: str) -> None:
    """Refuse ``what``, which ends the capture and begins it again (a
    conditional block's node, its opening or closing), while a stream forked
    into it is not joined back. Nothing is recorded."""
    left = unjoined(session)
    if left:
        raise ConditionalError(
            f"{what} cannot be recorded while {names(left)} {'are' if len(left) > 1 else 'is'} "
            f"forked into the capture on {session.stream!r} and not joined back: "
            "conditional blocks are recorded by ending the capture and beginning it "
            "again, which CUDA does only once every forked stream is joined back "
            "(it reports an unjoined capture otherwise). Leave the `with ng.fork(...)` block "
            "first; for a conditional on a side stream's work, open the block on the "
            f"capture's own stream ({session.stream!r}) and fork inside its body. "
            "Nothing was recorded; the capture goes on")


def restarted(session: Session) -> None:
    """A conditional block ended the capture and began it again, on the
    capture's own stream alone: the streams forked into it left it."""
    for fork in _registry.drop_forks(session):
        _backend.leave_capture(session.recording, fork.handle)


def settle(session: Session) -> list[Fork]:
    """Join every forked stream that is not joined back into the capture's
    own stream, as a conditional body or the capture is about to end and
    CUDA would refuse to end it otherwise; returns those streams."""
    left = unjoined(session)
    for fork in left:
        try:
            _backend.wait_stream(session.handle, fork.handle)
        except Exception:  # noqa: BLE001  the driver reports a broken capture as it ends
            pass
    return left
