"""The captures in progress: one home for the state every module reads.

Plain data and the few functions that change it. ``capture`` adds and ends
captures, ``safety`` ends those a refused operation breaks; ``graph``,
``scalar``, ``conditional``, ``alloc`` and ``ops`` read them. Nothing here
decides a capture rule: that is :mod:`numbagraph.safety`.

How to ask:

* is any capture in progress: ``if sessions:`` (hot paths read the dict);
* the capture on a stream: :func:`on` (``sessions`` is keyed by
  :func:`key_of`, which tells the threads' per-thread default streams apart);
* every capture, on every thread: :func:`active`.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterable

from . import _graphmem
from .backend import PER_THREAD_HANDLE
from .backend import active as _backend
from .backend import capture_key as key_of
from .errors import CaptureInvalidatedError

__all__ = [
    "LEGACY_DEFAULT_HANDLES", "PER_THREAD_HANDLE", "Session", "Fork", "sessions", "lock", "key_of",
    "on", "active", "add", "add_fork", "drop_forks",
    "claim", "ended", "discard", "invalidate", "consequence", "raise_if_invalidated",
    "take_ended", "release_when_idle", "run_deferred", "forget_orphans", "device_wrappers",
    "launch_checks",
    "register_device_wrapper", "unsafe_call", "no_unsafe_calls",
]

LEGACY_DEFAULT_HANDLES = (0, 1)
"""Handles of the legacy default stream: it never captures, and work on it
waits on every blocking stream."""


class Session:
    """A capture in progress: the backend recording plus what it must keep."""

    __slots__ = (
        "stream", "handle", "key", "mode", "recording", "keepalive", "thread",
        "_joins_legacy", "failure", "events", "restarts", "ending", "memory", "block", "forks",
        "blas", "device", "begun_at", "instantiate",
    )

    def __init__(self, stream: Any, handle: int, mode: str):
        self.stream = stream
        self.handle = handle
        self.key = key_of(handle)
        # The ordinal of the device the capture records on: its stream's,
        # which was current as it began.
        self.device = 0
        # (file, line) of the user's code that began it, for the warning of a
        # program that ends while it is open.
        self.begun_at: tuple[str, int] | None = None
        self.mode = mode
        self.keepalive: list = []
        # The Thread object, not its ident: idents are reused after a thread
        # ends, and a new thread must not inherit a dead one's capture.
        self.thread = threading.current_thread()
        # Set when another thread's refused operation invalidated this
        # capture; the owning thread ends it at its next use.
        self.failure: BaseException | None = None
        # Events recorded inside -> what they stand for (a _forks.Mark: the
        # stream, its work then, the value of `restarts`); made on first use.
        self.events: weakref.WeakKeyDictionary | None = None
        # The other streams in the capture, by capture key: those made to
        # wait on an event recorded in it (see numbagraph._forks).
        self.forks: dict[Any, Fork] = {}
        # How many times a conditional block has ended and begun the capture
        # again: an event of the capture before a restart cannot be waited on.
        self.restarts = 0
        # Claimed by the caller that ends it: it stays among the captures in
        # progress until the driver has ended it, so that every check still
        # sees it, and no other caller ends it too.
        self.ending = False
        # The memory the capture allocates (a _graphmem.GraphMemory), made at
        # its first allocation; and the innermost conditional block open in
        # it, by name (None: the capture's own graph).
        self.memory: Any = None
        self.block: str | None = None
        # The cuBLAS workspaces its graph owns, by capture key of the stream
        # that uses each (numbagraph.ops._blas); made at its first cuBLAS call.
        self.blas: dict | None = None
        # Whether its graph is instantiated as it ends (else at first use): a
        # run that re-sizes another graph ends with a graph never launched.
        self.instantiate = True
        # Asked before the capture begins: asked of a capturing stream, the
        # driver would invalidate its capture.
        self._joins_legacy: bool | None = _backend.joins_legacy_stream(handle)
        # Holds numba's frees until released by ended(): a free during a
        # capture would break it.
        self.recording = _backend.Recording(handle, mode)

    @property
    def joins_legacy(self) -> bool:
        """Whether work on the legacy default stream waits on this stream,
        and so would join the capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)."""
        if self._joins_legacy is None:
            self._joins_legacy = _backend.joins_legacy_stream(self.handle)
        return self._joins_legacy

    @property
    def may_end_here(self) -> bool:
        """Whether this thread may end the capture: CUDA lets only the thread
        that began a "thread_local" or "global" capture end it."""
        return self.mode == "relaxed" or self.thread is threading.current_thread()

    @property
    def current(self) -> bool:
        """Whether this capture is still in progress, and no caller is
        ending it."""
        return not self.ending and sessions.get(self.key) is self

    def keep(self, obj: Any) -> None:
        """Keep ``obj`` alive for as long as the graph lives."""
        self.keepalive.append(obj)


class Fork:
    """A stream forked into a capture: it waited on an event recorded in it.

    ``join`` is None until the stream is joined into another stream of the
    capture; then ``(capture key of that stream, work)``, "work" being what
    the backend's ``capture_frontier`` said of this stream as it was."""

    __slots__ = ("stream", "handle", "key", "join", "_joins_legacy")

    def __init__(self, stream: Any, handle: int):
        self.stream = stream
        self.handle = handle
        self.key = key_of(handle)
        self.join: tuple | None = None
        self._joins_legacy: bool | None = None

    @property
    def joins_legacy(self) -> bool:
        """Whether work on the legacy default stream waits on this stream."""
        if self._joins_legacy is None:
            self._joins_legacy = _backend.joins_legacy_stream(self.handle)
        return self._joins_legacy


sessions: dict[Any, Session] = {}
"""capture key (:func:`key_of`) -> the capture in progress on that stream;
a stream forked into a capture maps to that capture's session."""
lock = threading.Lock()
"""Held while a capture is added or removed, and while deferred releases run."""

# capture key -> the refused operation that ended the capture on that stream, so
# that end_capture can say why there is no graph. Kept without a traceback
# (which would pin the frames it passed through), for the latest streams.
_ended: dict[int, BaseException] = {}
_ENDED_KEPT = 256


def _remember_ended(key: Any, error: BaseException) -> None:
    try:
        reason = type(error)(*error.args)
    except Exception:  # noqa: BLE001  an exception type that takes other arguments
        reason = CaptureInvalidatedError(str(error))
    _ended.pop(key, None)
    _ended[key] = reason
    while len(_ended) > _ENDED_KEPT:
        del _ended[next(iter(_ended))]


def on(handle: int) -> Session | None:
    """The capture in progress on the stream ``handle``, as this thread sees
    that stream."""
    return sessions.get(key_of(handle))


def active() -> list[Session]:
    """The captures in progress, on every thread (each once, whatever the
    streams forked into it)."""
    return [s for key, s in list(sessions.items()) if key == s.key]


def add(stream: Any, handle: int, mode: str) -> Session:
    """Begin a capture on the stream and register it; call with :data:`lock`
    held, once sure the stream has none."""
    session = Session(stream, handle, mode)
    _ended.pop(session.key, None)
    sessions[session.key] = session
    return session


def add_fork(session: Session, stream: Any, handle: int) -> Fork:
    """Count the stream ``handle`` in the capture ``session`` from now on;
    call once sure no capture has it."""
    fork = Fork(stream, handle)
    with lock:
        sessions[fork.key] = session
        session.forks[fork.key] = fork
    return fork


def drop_forks(session: Session) -> list[Fork]:
    """Count no stream forked into ``session`` in it any more; returns them."""
    with lock:
        return _drop_forks(session)


def _drop_forks(session: Session) -> list[Fork]:
    forks = list(session.forks.values())
    session.forks = {}
    for fork in forks:
        if sessions.get(fork.key) is session:
            del sessions[fork.key]
    return forks


def claim(session: Session) -> bool:
    """Make this caller the one that ends the session; False when another
    has already. The session stays among the captures in progress until
    :func:`ended`. Call with :data:`lock` held."""
    if not session.current:
        return False
    session.ending = True
    return True


def ended(session: Session, *, locked: bool = False) -> None:
    """What follows a claimed session's end in the driver: it leaves the
    captures in progress, numba frees again, and (unless ``locked``: the
    caller holds :data:`lock` and runs :func:`run_deferred` after) the
    releases waiting for no capture run if none is left."""
    if locked:
        _leave(session)
        return
    with lock:
        _leave(session)
    run_deferred()


def _leave(session: Session) -> None:
    if sessions.get(session.key) is session:
        del sessions[session.key]
    _drop_forks(session)
    memory = session.memory
    if memory is not None and memory.phase == _graphmem.CAPTURING:
        memory.end(_graphmem.DISCARDED)  # no graph: nothing was allocated
    # Under the lock, as the hold was taken: the count it lowers is shared.
    session.recording.release_frees()


def discard(session: Session) -> None:
    """End a session's capture and drop what it recorded, unless another
    caller ends it already."""
    # The capture ends under the lock, and counts as running for every
    # other thread until the driver has ended it.
    with lock:
        if not claim(session):
            return
        try:
            session.recording.abort()
        finally:
            session.keepalive = []
            ended(session, locked=True)
    run_deferred()


def take_ended(handle: int, *, locked: bool = False) -> BaseException | None:
    """Why the last capture on the stream ended, if a refused operation (or
    its thread's end) ended it; forgotten once taken. ``locked``: the
    caller holds :data:`lock`."""
    key = key_of(handle)
    if locked:
        return _ended.pop(key, None)
    with lock:
        return _ended.pop(key, None)


def invalidate(ended: Iterable[Session], error: BaseException) -> None:
    """End the captures that a refused operation would have broken.

    Captures begun on this thread end now and their graphs are discarded.
    CUDA lets only the beginning thread end a capture in mode "global" or
    "thread_local", so a capture of another thread is marked instead: its
    thread's next launch on the stream, or its end_capture, ends it and
    raises CaptureInvalidatedError.
    """
    me = threading.current_thread()
    for session in ended:
        if session.thread is me:
            with lock:
                current = session.current
                if current:
                    _remember_ended(session.key, error)
            if current:
                discard(session)
        elif session.failure is None:
            session.failure = error


def consequence(ended: Iterable[Session]) -> str:
    """What :func:`invalidate` does to these captures, for error messages."""
    me = threading.current_thread()
    ended = list(ended)
    own = [repr(s.stream) for s in ended if s.thread is me]
    other = [repr(s.stream) for s in ended if s.thread is not me]
    parts = []
    if own:
        parts.append(
            f"The capture on {', '.join(own)} was ended and its graph discarded; "
            "the stream is usable and a new capture may begin."
        )
    if other:
        parts.append(
            f"The capture on {', '.join(other)}, begun by another thread, was "
            "invalidated: its next launch or end_capture there raises "
            "CaptureInvalidatedError."
        )
    return " ".join(parts)


def raise_if_invalidated(session: Session) -> None:
    """End ``session`` and raise if another thread's refused operation
    invalidated it (see :func:`invalidate`)."""
    failure = session.failure
    if failure is None:
        return
    if not session.may_end_here:
        return
    with lock:
        current = session.current
    if current:
        discard(session)
    raise CaptureInvalidatedError(
        f"the capture on {session.stream!r} was invalidated by an operation "
        f"refused on another thread ({failure}). It has been ended and its "
        "graph discarded; begin a new capture once the other thread no longer "
        "makes that call"
    ) from failure


# ---------------------------------------------------------------- unsafe calls

# Calls CUDA forbids on every thread while a "global" capture runs
# (allocating, synchronizing, copying through the host) are counted while in
# flight. A "global" capture begins only once none is, and while one begins
# no new one starts: otherwise a call could pass its check before the capture
# exists and reach the driver after, which the driver refuses, invalidating
# the capture. A beginning capture goes first: calls wait for it, so that
# threads making such calls back to back cannot hold it off. A call made
# inside another on the same thread never waits (its thread is counted
# already). The count has its own lock, never taken with `lock` held.
_unsafe = threading.Condition(threading.Lock())
_unsafe_in_flight = 0
_beginning = 0
_depth = threading.local()  # .n: unsafe calls this thread is inside


class _UnsafeCall:
    """``with unsafe_call:`` around a call CUDA forbids during a "global"
    capture, checks included."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _unsafe_in_flight
        depth = getattr(_depth, "n", 0)
        with _unsafe:
            if not depth:
                while _beginning:
                    _unsafe.wait()
            _unsafe_in_flight += 1
        _depth.n = depth + 1

    def __exit__(self, *exc_info: Any) -> None:
        global _unsafe_in_flight
        _depth.n -= 1
        with _unsafe:
            _unsafe_in_flight -= 1
            if not _unsafe_in_flight:
                _unsafe.notify_all()


unsafe_call = _UnsafeCall()


class _NoUnsafeCalls:
    """``with no_unsafe_calls:`` while a "global" capture begins: waits for
    the unsafe calls in flight, and holds new ones back until it has begun."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _beginning
        with _unsafe:
            _beginning += 1
            try:
                while _unsafe_in_flight:
                    _unsafe.wait()
            except BaseException:  # interrupted: let the held-back calls go
                _beginning -= 1
                _unsafe.notify_all()
                raise

    def __exit__(self, *exc_info: Any) -> None:
        global _beginning
        with _unsafe:
            _beginning -= 1
            _unsafe.notify_all()


no_unsafe_calls = _NoUnsafeCalls()


# ---------------------------------------------------------------- releases

# Releases that may call the driver in ways CUDA forbids during a capture
# (destroying graphs, freeing memory), waiting for no capture to be active.
_deferred: list[Callable[[], None]] = []


def release_when_idle(free: Callable[[], None]) -> None:
    """Run ``free()`` now if no capture is active, else once the last one
    ends. Safe to call from finalizers, on any thread."""
    _deferred.append(free)
    forget_orphans()
    run_deferred()


_ORPHANED = {
    "thread_local": (
        "the thread that began the capture on {stream} ended without ending "
        "it, in mode 'thread_local', which CUDA lets no other thread end. "
        "numbagraph forgot the capture and released what it held; the stream "
        "still captures until it is destroyed: use another stream"
    ),
    "relaxed": (
        "the thread that began the capture on {stream} ended without ending "
        "it; numbagraph ends it once no other capture runs"
    ),
}

# Recordings of captures that no thread may end: kept, never closed, since
# closing one destroys the graph a stream still captures into.
_stranded: list[Any] = []


def forget_orphans() -> None:
    """Forget the captures whose thread ended without ending them, so that
    deferred releases and numba's frees are not held forever. A "relaxed"
    capture is ended; a "thread_local" one, which CUDA lets no other thread
    end, is left capturing on its stream, holding nothing; a "global" one
    stays, since CUDA forbids frees on every thread while it lives. Never
    blocks."""
    orphans = [s for s in active() if s.mode != "global" and not s.thread.is_alive()]
    if not orphans or not lock.acquire(blocking=False):
        return
    try:
        orphans = [s for s in orphans if claim(s)]
        for session in orphans:
            _remember_ended(session.key, CaptureInvalidatedError(
                _ORPHANED[session.mode].format(stream=repr(session.stream))))
    finally:
        lock.release()
    for session in orphans:
        if session.mode == "relaxed":
            # Ending it destroys its graph, which waits for no capture to run.
            _deferred.append(session.recording.abort)
        else:
            session.recording.strand()
            _stranded.append(session.recording)
        session.keepalive = []
        ended(session)


def run_deferred() -> None:
    """Run the releases waiting for no capture to be active, if none is."""
    while _deferred and not sessions:
        # Never block: this runs from finalizers, which may fire while this
        # very thread holds the lock. Whoever holds it runs these after.
        if not lock.acquire(blocking=False):
            return
        try:
            if sessions:
                return
            pending = _deferred[:]
            del _deferred[: len(pending)]
            for free in pending:
                try:
                    free()
                except Exception:  # noqa: BLE001  a failed free must not stop the rest
                    pass
        finally:
            lock.release()


# ---------------------------------------------------------------- wrappers

device_wrappers: dict[type, Callable[[Any], Any]] = {}
"""Types passed to kernels in place of the device value they wrap, and how
to unwrap them: a launch is made with ``unwrap(obj)``."""


def register_device_wrapper(cls: type, unwrap: Callable[[Any], Any],
                            check: Callable[[Any, Any], None] | None = None) -> None:
    """Launch kernels with ``unwrap(obj)`` wherever an instance of ``cls``
    is passed; with ``check``, a launch given one while a capture runs first
    calls ``check(obj, session)``, ``session`` the capture it records into
    (None: it runs at once), which raises to refuse it."""
    device_wrappers[cls] = unwrap
    if check is not None:
        launch_checks[cls] = check


launch_checks: dict[type, Callable[[Any, Any], None]] = {}
"""The device wrappers whose launches are checked against the capture they
record into, and their checks (see :func:`register_device_wrapper`)."""
