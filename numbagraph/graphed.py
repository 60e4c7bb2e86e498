"""Graphed functions: a plain function of launches, replayed as a graph.

A call is known by its signature: per argument, the kind and layout of an
array or DeviceScalar (not its address), and the value of anything else. The
first calls of a signature run the function as written (compiling its
kernels); the next one captures it. After that, a call of that signature
rebinds the graph to the arrays it is given, if they are not the ones the
graph holds, and replays it; arrays that take turns get graphs of their
own (twins), each bound to them for good. With ``sizes="update"``, a call
whose arrays differ from a kept graph's only in shape gives that graph the
call's sizes by node updates (``_resize``) instead of capturing another.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

import numpy as np

from . import _graphmem, _registry, _resize
from ._reached import Reached, Shared, reached, shared
from ._rebind import FixedNodesError, OperandsError, Transition, device_array_of, span
from ._registry import sessions as _captures
from .backend import active as _backend
from .backend.interface import Move
from .capture import capture
from .errors import (AllocationInCaptureError, GraphedError, GraphedWarning, GraphMemoryError,
                     RebindError)
from .graph import CapturedGraph
from .scalar import DeviceScalar

__all__ = ["graphed", "GraphedFunction", "GraphedCacheInfo"]


class GraphedCacheInfo(NamedTuple):
    """What a graphed function's cache did, over all its streams."""

    hits: int
    """Calls replayed from a graph already captured (rebound or not)."""
    captures: int
    """Calls that captured a new graph."""
    rebinds: int
    """Calls that rebound a graph to other arrays before replaying it."""
    evictions: int
    """Signatures' graphs closed to keep at most ``max_graphs`` per stream
    (graphs of arrays that take turns, closed first, are not counted)."""
    eager: int
    """Calls that ran the function as written (warm-up, or inside a capture)."""
    graphs: int
    """Graphs held now."""
    max_graphs: int
    """Graphs held at most, per stream."""
    resizes: int = 0
    """Calls that gave a kept graph new sizes by node updates (``sizes="update"``)."""


# What a call's result is made of: None, the position of an argument, or a
# tuple or list of them.
_Result = Any


class _Entry:
    """One captured signature: its graph, the values it holds now (by
    position among the call's values) and how to build the result."""

    __slots__ = ("graph", "launch", "bound", "spans", "result", "before", "sig", "seen",
                 "transitions", "reached", "twins", "twinless", "turns")

    def __init__(self, graph: CapturedGraph, values: tuple, spans: dict[int, tuple],
                 result: _Result, before: int = 0, sig: tuple = (), seen: _Seen | None = None):
        self.graph, self.launch, self.result = graph, graph.launch, result
        # The signature it is kept under now.
        self.sig = sig
        # Calls of the signature before the graph's first launch.
        self.before = before
        self.bound = values
        # Position -> (pointer, start, end) of each distinct array bound now.
        self.spans = spans
        # The _Seen of the values bound now, where they are of fixed memory.
        self.seen = seen
        # (the _Seen bound before, the _Seen bound after) -> (the positions
        # whose arrays changed, the graph's Transition) of the rebindings
        # made between them: a call bringing back arrays seen before makes
        # the same one again at the driver's cost.
        self.transitions: dict[tuple[_Seen | None, _Seen | None],
                               tuple[tuple[int, ...], Transition]] = {}
        # The memory the function reached other than through its arguments
        # when the graph was captured (_reached).
        self.reached: list[Reached] = []
        # The signature's other graphs (_twin), each bound for good to a
        # remembered call's arrays that keep coming back; kept by the entry
        # the cache holds the signature under, empty on the others.
        self.twins: list[_Entry] = []
        # Whether the entry makes no more twins: one failed to capture, or
        # was forgotten before it paid for its capture (_PAYBACK), or the
        # function gives its graphs new sizes (sizes="update").
        self.twinless = False
        # Calls that launched its graph other than by the hot path.
        self.turns = 0

    def bind(self, values: tuple, spans: dict[int, tuple], seen: _Seen | None) -> None:
        """Hold ``values`` as those the graph is bound to now."""
        self.bound, self.spans, self.seen = values, spans, seen


class _Seen:
    """A recent call's values, for a later call given the same objects to
    skip working out its signature: each array weakly (it may be freed
    meanwhile, and its id reused; its twin, if any, holds them), each plain
    value as it is; with that
    signature and ``{position: (pointer, start, end)}`` of each distinct
    array, which callers share and never change."""

    __slots__ = ("keys", "held", "sig", "spans", "again", "twin")

    def __init__(self, values: tuple, keys: tuple, sig: tuple, spans: dict[int, tuple]):
        self.keys, self.sig, self.spans = keys, sig, spans
        # Whether a later call was given these values again.
        self.again = False
        # The graph of the signature bound to these values for as long as
        # they are remembered (_twin), if one is.
        self.twin: _Entry | None = None
        self.held: tuple[tuple[Any] | weakref.ref[Any], ...] = tuple(
            (value,) if s[0] == _VALUE else weakref.ref(value) for value, s in zip(values, sig))

    def spans_of(self, values: tuple, keys: tuple) -> dict[int, tuple] | None:
        """The spans of the call's arrays, if ``values`` are this call's."""
        if keys != self.keys or len(values) != len(self.held):
            return None
        for held, value in zip(self.held, values):
            if isinstance(held, tuple):
                if held[0] is not value and not _same_plain(held[0], value):
                    return None
            elif held() is not value or value is None:  # None: an array freed since
                return None
        return self.spans


class _Cache:
    """The graphs of one stream, least recently used first, and the calls
    made on it; one call at a time."""

    __slots__ = ("lock", "entries", "families", "warm", "seen", "last_values", "last_keys",
                 "last_entry", "last_sig", "prev_entry", "prev_seen", "hits", "captures",
                 "rebinds", "evictions", "eager", "resizes", "twins", "generation")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        # Moves on at each reset: work begun before one knows it was cleared.
        self.generation = 0
        self.reset()

    def reset(self) -> None:
        """Forget every graph, signature and count (the lock stays)."""
        self.generation += 1
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()
        # With sizes="update": each family's (``_resize.family_of``) graphs,
        # the latest used first.
        self.families: dict[tuple, list[_Entry]] = {}
        self.warm: dict[tuple, int] = {}
        # The calls whose signatures were worked out, the latest given again first.
        self.seen: list[_Seen] = []
        self.last_values: tuple | None = None
        self.last_keys: tuple = ()
        self.last_entry: _Entry | None = None
        self.last_sig: tuple | None = None
        # The launch of the call before the last: its entry, and the _Seen
        # of its values, which the entry was bound to then (_turn). Neither
        # holds an array the entry no longer does.
        self.prev_entry: _Entry | None = None
        self.prev_seen: _Seen | None = None
        self.hits = self.captures = self.rebinds = self.evictions = self.eager = 0
        self.resizes = 0
        # Twins held, over all entries.
        self.twins = 0

    def graphs(self) -> int:
        """The graphs held: an entry's, and each of its twins'."""
        return len(self.entries) + self.twins

    def forget(self, entry: _Entry) -> None:
        """Drop ``entry``, closed or about to be, from the families."""
        for family, held in list(self.families.items()):
            if entry in held:
                held.remove(entry)
                if not held:
                    del self.families[family]


_VALUE = "value"
# The key, among a graphed function's warnings given, of the one saying that
# calls with other arrays capture again (argument positions are the others).
_CUBLAS_WARNING = -1


def _name_of(position: int, nargs: int, keys: tuple) -> str:
    """How errors name the value at ``position`` among a call's values."""
    return f"{position}" if position < nargs else repr(keys[position - nargs])


def _dtype_key(dtype: np.dtype) -> Any:
    """A dtype as a signature holds it: its type string, or the dtype itself
    where the string says too little (a structured dtype's is only its size)."""
    return dtype.str if dtype.fields is None else dtype


def _signature_of(value: Any, position: int, nargs: int, keys: tuple) -> tuple:
    """What a call's value at ``position`` contributes to its signature."""
    kind = type(value)
    if isinstance(value, DeviceScalar):
        return ("scalar", kind, value.dtype.str)
    if isinstance(value, _backend.DEVICE_ARRAY_TYPES):
        dev: Any = value
        return ("array", kind, tuple(dev.shape), _dtype_key(np.dtype(dev.dtype)),
                tuple(dev.strides))
    interface = getattr(value, "__cuda_array_interface__", None)
    if interface is not None:
        typestr = interface["typestr"]
        descr = interface.get("descr")
        if typestr[1:2] == "V" and descr is not None:
            typestr = _dtype_key(np.dtype(descr))
        return ("array", kind, tuple(interface["shape"]), typestr,
                tuple(interface.get("strides") or ()))
    if isinstance(value, np.ndarray):
        raise GraphedError(
            f"argument {_name_of(position, nargs, keys)} is a host (NumPy) array; a graph "
            "reads device memory. "
            "Copy it to the device once (cuda.to_device) and pass the device array")
    try:
        hash(value)
    except TypeError:
        raise GraphedError(
            f"argument {_name_of(position, nargs, keys)} ({kind.__name__}) is not "
            "hashable, so it cannot be part "
            "of a call's signature; pass a value that changes per call in a "
            "DeviceScalar, and data in a device array") from None
    # A float is known by its bits: -0.0 is not 0.0, and a NaN is itself.
    return (_VALUE, kind, value.hex() if kind is float else value)


class _Made:
    """A result the function allocated inside its capture: each call returns
    a new array over its memory, valid until the graph is launched again."""

    __slots__ = ("array", "allocation", "memory", "name", "before")

    def __init__(self, array: Any, allocation: Any, name: str, before: int):
        self.array, self.allocation, self.name = array, allocation, name
        self.memory = allocation.memory
        # Calls of the signature before the graph's first launch (warm-up
        # calls, an earlier graph's): errors count calls as the user does.
        self.before = before

    def made(self) -> Any:
        memory = self.memory
        label = f"call {self.before + memory.launches} of {self.name}() with this signature"
        if memory.callers.get(memory.launches) != label:
            memory.called(label)
        return _backend.graph_output(self.array, self.allocation,
                                     _graphmem.Output(memory.launches, label))


def _result_plan(result: Any, values: tuple, memory: Any, name: str,
                 before: int = 0) -> _Result:
    if result is None:
        return None
    for i, value in enumerate(values):
        if result is value:
            return i
    if isinstance(result, (tuple, list)):
        plan = [_result_plan(item, values, memory, name, before) for item in result]
        return tuple(plan) if isinstance(result, tuple) else plan
    found = _backend.graph_memory_of(result)
    if found is not None and found[0].memory is memory and not found[0].freed:
        return _Made(result, found[0], name, before)
    raise GraphedError(
        f"the function returned a {type(result).__name__} that is neither one of its "
        "arguments nor an array it allocated (and did not free); a graphed function "
        "returns its array arguments, arrays it allocates inside (new ones at each "
        "call), tuples or lists of them, or None")


def _result_of(plan: _Result, values: tuple) -> Any:
    if plan is None:
        return None
    if type(plan) is int:
        return values[plan]
    if type(plan) is _Made:
        return plan.made()
    items = [_result_of(item, values) for item in plan]
    return tuple(items) if isinstance(plan, tuple) else items


_PLAIN = frozenset({int, float, complex, bool, str, bytes, type(None)})


def _same_plain(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b``, not the same object, are one plain value as
    a signature counts it."""
    kind = type(a)
    if kind is not type(b) or kind not in _PLAIN:
        return False
    return a.hex() == b.hex() if kind is float else bool(a == b)


def _value_of(sig: tuple) -> Any:
    return float.fromhex(sig[2]) if sig[1] is float else sig[2]


# The types whose layout and memory never change, so that what a call
# learns of one holds for its life.
_FIXED = frozenset((*_backend.DEVICE_ARRAY_TYPES, DeviceScalar))
# Calls remembered per stream: enough for arrays that take turns (a ping-
# pong, a ring of up to four sets), with room for a call or two between.
_SEEN = 6
# Rebindings an entry keeps to make again (_Entry.transitions); past that,
# the oldest kept is forgotten.
_TRANSITIONS = 16
# Twins an entry has at most: with the entry, a graph for each set of a
# ring of four.
_TWINS = 3
# Calls a twin is launched by, other than by the hot path, to pay for its
# capture (about what rebindings of a small step that many cost): one
# forgotten before that stops its entry making twins, for arrays that come
# back too seldom.
_PAYBACK = 16

_PER_THREAD = _registry.PER_THREAD_HANDLE


def _redone(entry: _Entry, key: tuple, values: tuple) -> bool:
    """Whether ``entry``'s graph made the rebinding it kept under ``key``
    again, to the call's ``values``; False, nothing changed, where it kept
    none or the graph changed otherwise since (it then forgets them all)."""
    known = entry.transitions.get(key)
    if known is None:
        return False
    again, transition = known
    if entry.graph._redo(transition, [values[i] for i in again],
                         lambda: [device_array_of(values[i]) for i in again]):
        return True
    entry.transitions.clear()
    return False


def _recent(cache: _Cache, values: tuple, keys: tuple) -> _Seen | None:
    """The remembered call given ``values``, made the latest used and
    marked as given again; None where none was."""
    found = cache.seen
    for k, seen in enumerate(found):
        if seen.spans_of(values, keys) is not None:
            _given_again(found, k, seen)
            return seen
    return None


def _given_back(found: list[_Seen], seen: _Seen) -> bool:
    """``seen``, the values of the call before the last, marked as given
    again and made the latest used, as ``_recent`` does; False where the
    remembered calls no longer hold it."""
    for k, known in enumerate(found):
        if known is seen:
            _given_again(found, k, seen)
            return True
    return False


def _given_again(found: list[_Seen], k: int, seen: _Seen) -> None:
    """``seen``, ``found[k]`` among the remembered calls, marked as given
    again and made the latest used."""
    seen.again = True
    if k:
        found.insert(0, found.pop(k))


def _launched(cache: _Cache, entry: _Entry, values: tuple, keys: tuple) -> _Entry:
    """``entry``, bound to the call's values, launched, and the call the
    last one (the hot path's)."""
    cache.hits += 1
    entry.turns += 1
    return _armed(cache, entry, values, keys)


def _armed(cache: _Cache, entry: _Entry, values: tuple, keys: tuple) -> _Entry:
    """``entry``, bound to the call's values, launched; the call is the
    last one, which the hot path compares the next with."""
    entry.graph.launch()
    cache.last_sig, cache.last_entry, cache.last_values = entry.sig, entry, values
    cache.last_keys = keys
    return entry


class _MakeTwin:
    """``_again``'s answer where the call's values get a graph of their own
    (``GraphedFunction._twin``)."""


_TWIN = _MakeTwin()


def _again(cache: _Cache, seen: _Seen, values: tuple, keys: tuple,
           max_graphs: int) -> _Entry | _MakeTwin | None:
    """The call of the values ``seen`` knows made, where a graph of their
    signature is bound to them (their twin, or the signature's entry) or
    the entry keeps the rebinding from the values it holds to them: the
    entry launched. ``_TWIN`` where the values came back to an entry bound
    to others that may have a twin. None where neither: the call is worked
    out in full."""
    sig = seen.sig
    entry = cache.entries.get(sig)
    if entry is None:
        return None
    twin = seen.twin
    if twin is None and entry.seen is None:
        return None
    # As the full call does: the signature is the latest used, and no call
    # takes the hot path until it launched.
    _disarm(cache)
    cache.entries.move_to_end(sig)
    if twin is not None:
        entry = twin
    else:
        if entry.seen is not seen:
            if (not entry.twinless and len(entry.twins) < _TWINS
                    and cache.graphs() < max_graphs and entry.graph._res.memory is None):
                return _TWIN
            if not _redone(entry, (entry.seen, seen), values):
                return None
            cache.rebinds += 1
        entry.bind(values, seen.spans, seen)
    return _launched(cache, entry, values, keys)


def _drop_twins(cache: _Cache, entry: _Entry, why: str) -> None:
    """Close every twin of ``entry``."""
    twins, entry.twins = entry.twins, []
    for twin in twins:
        _drop_twin(cache, twin, why)


def _drop_twin(cache: _Cache, twin: _Entry, why: str) -> None:
    """Close ``twin``, taken from its entry's twins already."""
    if twin.seen is not None:
        twin.seen.twin = None
    cache.twins -= 1
    _let_go(cache, twin, why)


def _forget_seen(cache: _Cache, dropped: list[_Seen], name: str) -> None:
    """The calls ``dropped`` are no longer remembered: their twins, which no
    call can find any more, are closed."""
    for seen in dropped:
        twin = seen.twin
        if twin is None:
            continue
        entry = cache.entries.get(twin.sig)
        if entry is not None and twin in entry.twins:
            entry.twins.remove(twin)
            if twin.turns < _PAYBACK:
                entry.twinless = True
        _drop_twin(cache, twin, f"the graph of {name}() for arrays that stopped "
                                "coming back")


def _close(entry: _Entry, why: str) -> None:
    """Close an entry's graph, saying why to the results that outlive it;
    the entry is bound to no call's values any more."""
    entry.seen = None
    memory = entry.graph._res.memory
    if memory is not None:
        memory.closed_by = why
    entry.graph.close()


def _let_go(cache: _Cache, entry: _Entry, why: str) -> None:
    """Close ``entry``, taken from the cache; neither the hot path nor the
    call before the last holds it (nor, through it, its arrays)."""
    if cache.last_entry is entry:
        cache.last_entry = cache.last_values = None
    if cache.prev_entry is entry:
        cache.prev_entry = cache.prev_seen = None
    _close(entry, why)


def _disarm(cache: _Cache) -> None:
    """No call takes the hot path until the call under way has launched;
    the last call's launch becomes the one before, where its values are
    known by a _Seen."""
    entry = cache.last_entry
    if entry is None:
        return
    if entry.seen is not None:
        cache.prev_entry, cache.prev_seen = entry, entry.seen
    cache.last_entry = cache.last_values = None


def _turn(cache: _Cache, entry: _Entry, values: tuple, keys: tuple) -> _Entry:
    """The call of the values of the call before the last, whose entry is
    still bound to them (two sets of arrays taking turns, each with its
    graph): the entry launched, with the bookkeeping the short way does."""
    seen = cache.prev_seen
    _disarm(cache)
    cache.entries.move_to_end(entry.sig)
    _given_back(cache.seen, seen)  # type: ignore[arg-type]
    return _launched(cache, entry, values, keys)


def _refuse_graph_memory(values: tuple, names: Any, name: str) -> None:
    """A graph keeps the arrays it is given from call to call: graph memory,
    which its own graph frees and makes again, cannot be one of them."""
    memory_of = _backend.graph_memory_of
    for i, value in enumerate(values):
        found = memory_of(value)
        if found is not None:
            raise GraphMemoryError(
                f"argument {names(i)} of {name}() is {found[0].what}: memory of a "
                "graph, which that graph frees and makes again at each of its "
                "launches, so a graphed function cannot hold it from call to call. "
                "Copy it (ng.copy_into) into an array made outside any capture and "
                "pass that")


class GraphedFunction:
    """A function replayed as a CUDA graph; made by [graphed][numbagraph.graphed.graphed].

    Calling it runs, captures or replays the function as its signature
    requires, and returns what the function returns. ``cache_info()`` counts
    what happened, ``clear()`` closes every graph.
    """

    def __init__(self, fn: Callable[..., Any], stream: Any, warmup: int, max_graphs: int,
                 sizes: str = "capture"):
        if not callable(fn):
            raise TypeError(f"ng.graphed takes a function, not {type(fn).__name__}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, not {warmup!r}")
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs must be an int >= 1, not {max_graphs!r}")
        if sizes not in _resize.MODES:
            raise ValueError(
                f"sizes must be 'capture' (a graph per shape) or 'update' (one graph "
                f"given each call's shapes by node updates), not {sizes!r}")
        self._sizes = sizes == "update"
        self._fn, self._stream, self._warmup, self._max = fn, stream, warmup, max_graphs
        self._handle = None if stream is None else _backend.stream_handle(stream)
        self._caches: dict[Any, _Cache] = {}
        self._lock = threading.Lock()
        # The warnings given: an argument's position, or a reason in words.
        self._warned: set[int | str] = set()
        self._name = getattr(fn, "__name__", type(fn).__name__)
        functools.update_wrapper(self, fn)

    @property
    def stream(self) -> Any:
        """The stream the function launches on (None: each call passes one)."""
        return self._stream

    @property
    def sizes(self) -> str:
        """``"update"`` when a new shape updates a kept graph, else ``"capture"``."""
        return "update" if self._sizes else "capture"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        handle = self._handle
        stream = self._stream
        if handle is None:
            stream = kwargs.get("stream")
            if stream is None:
                raise GraphedError(
                    f"{self._name}() was graphed without a stream, so each call "
                    "passes one: call it with stream=s (it is passed on to the "
                    "function), or graph it with ng.graphed(stream=s)")
            handle = _backend.stream_handle(stream)
        if _captures:
            session = _registry.on(handle)
            if session is not None and session.thread is threading.current_thread():
                # Inside this thread's capture on its stream: the launches
                # join that capture. Another thread's capture on the stream
                # (this function capturing there) is waited for below, under
                # the stream's lock, so that its launches stay out of it.
                cache = self._cache(handle)
                cache.eager += 1
                return self._fn(*args, **kwargs)
        keys: tuple = ()
        values = args
        if kwargs:
            # The stream a call names picks its cache; it is not in the signature.
            keys = tuple(sorted(k for k in kwargs if k != "stream" or self._handle is not None))
            values = args + tuple(kwargs[k] for k in keys)
        cache = self._caches.get(handle) if handle != _PER_THREAD else None
        if cache is None:
            cache = self._cache(handle)
        with cache.lock:
            # Hot path (a replay loop calling with the same arrays): the values
            # of the last call, compared inline, and the graph launched.
            entry, last = cache.last_entry, cache.last_values
            if entry is not None and len(values) == len(last) and keys == cache.last_keys:  # type: ignore[arg-type]
                for a, b in zip(values, last):  # type: ignore[arg-type]
                    if a is not b and not _same_plain(a, b):
                        break
                else:
                    cache.hits += 1
                    entry.launch()
                    plan = entry.result
                    if type(plan) is int:
                        return values[plan]
                    return None if plan is None else _result_of(plan, values)
            # Next (two sets of arrays taking turns): the values of the call
            # before the last, their graph still bound to them.
            entry, seen = cache.prev_entry, cache.prev_seen
            back = False
            if entry is not None and seen.spans_of(values, keys) is not None:  # type: ignore[union-attr]
                if entry.seen is seen:
                    return _result_of(_turn(cache, entry, values, keys).result, values)
                back = True
            # Next (arrays taking turns): the values of a recent call (those
            # of the call before the last first, found without a search),
            # and their graph, or a rebinding to them the graph made before,
            # made again.
            searched = bool(cache.seen) and not _graphmem.held[0]
            if not searched:
                recent = None
            elif back and _given_back(cache.seen, seen):  # type: ignore[arg-type]
                recent = seen
            else:
                recent = _recent(cache, values, keys)
            if recent is not None:
                entry = self._short_way(cache, recent, stream, args, kwargs, keys, values, 2)
                if entry is not None:
                    return _result_of(entry.result, values)
            return self._call(cache, stream, args, kwargs, keys, values, recent, searched)

    def _short_way(self, cache: _Cache, seen: _Seen, stream: Any, args: tuple, kwargs: dict,
                   keys: tuple, values: tuple, depth: int) -> _Entry | None:
        """The entry that made the call of the values ``seen`` knows: by
        ``_again``, or a twin captured for them (``depth``: frames between
        this one and the user's call); None where the call is worked out in
        full."""
        again = _again(cache, seen, values, keys, self._max)
        if again is _TWIN:
            return self._twin(cache, seen, stream, args, kwargs, keys, values, depth + 1)
        return again if isinstance(again, _Entry) else None

    def _cache(self, handle: int) -> _Cache:
        key = _registry.key_of(handle)
        cache = self._caches.get(key)
        if cache is None:
            with self._lock:
                cache = self._caches.setdefault(key, _Cache())
        return cache

    def _call(self, cache: _Cache, stream: Any, args: tuple, kwargs: dict, keys: tuple,
              values: tuple, recent: _Seen | None = None, searched: bool = False) -> Any:
        """The call worked out: ``recent``, where ``searched``, is the
        remembered call given these values (``_recent``)."""
        if _graphmem.held[0]:
            _refuse_graph_memory(values, lambda i: _name_of(i, len(args), keys), self._name)
        sig, spans, seen = self._signature(cache, values, len(args), keys, recent, searched)
        if seen is not None and seen.again and not searched:
            # The short way, where the call skipped it to check its values.
            found = self._short_way(cache, seen, stream, args, kwargs, keys, values, 3)
            if found is not None:
                return _result_of(found.result, values)
        # Until this call's graph has launched, no call takes the hot path.
        _disarm(cache)
        entry = cache.entries.get(sig)
        tried = False
        if entry is None and self._sizes:
            entry, tried = self._resize(cache, sig, stream, args, kwargs, values, spans, seen)
            if entry is not None:
                return _result_of(_armed(cache, entry, values, keys).result, values)
        if entry is None:
            names = [_name_of(i, len(args), keys) for i in range(len(values))]
            self._warn_if_values_change(cache.last_sig, sig, names)
            cache.last_sig = sig
            # With sizes="update", the calls of a family warm it up whatever
            # their sizes.
            warm = _resize.family_of(sig) if self._sizes else sig
            done = cache.warm.get(warm, 0)
            # A run that could not re-size a graph compiled what it launches.
            if done < self._warmup and not tried:
                if len(cache.warm) > 4 * self._max:
                    cache.warm.clear()
                cache.warm[warm] = done + 1
                cache.eager += 1
                return self._fn(*args, **kwargs)
            entry = self._capture(cache, sig, stream, args, kwargs, values, spans, seen, names)
        else:
            cache.entries.move_to_end(sig)
            refused = self._rebind(cache, entry, values, spans, seen,
                                   lambda i: _name_of(i, len(args), keys))
            if refused is None:
                cache.hits += 1
            else:
                if isinstance(refused, Shared) and str(refused) not in self._warned:
                    self._warned.add(str(refused))
                    warnings.warn(str(refused), GraphedWarning, stacklevel=3)
                # An op refusing these arrays refuses them as the capture records it.
                entry = self._capture_again(cache, sig, entry, stream, args, kwargs,
                                            keys, values, spans, seen,
                                            cublas=isinstance(refused, FixedNodesError))
        return _result_of(_armed(cache, entry, values, keys).result, values)

    def _rebind(self, cache: _Cache, entry: _Entry, values: tuple, spans: dict[int, tuple],
                seen: _Seen | None, names: Callable[[int], str]) -> RebindError | None:
        """Bind ``entry``'s graph to the call's arrays, of its signature; or,
        the graph unchanged, the error of an op that refuses them, or of an
        argument that was memory the function also reaches another way (the
        call is captured instead)."""
        bound = entry.bound
        key = (entry.seen, seen)
        if seen is not None and _redone(entry, key, values):
            entry.bind(values, spans, seen)
            cache.rebinds += 1
            return None
        # Same signature: same layouts and sharing, so each array moves as a
        # whole to the one in its place.
        positions, pairs, moves = [], [], []
        for i, (ptr, start, end) in entry.spans.items():
            old, new = bound[i], values[i]
            # An array over the memory of the one bound (a new view of it,
            # of the same layout) moves nothing; another library's array
            # that is the one bound moves where its memory moved since.
            if spans[i][0] != ptr:
                positions.append(i)
                pairs.append((old, new))
                moves.append(Move(start, end, spans[i][0] - ptr, device_array_of(new)))
        if not moves:
            entry.bind(values, spans, seen)
            return None
        if entry.reached:
            refused = shared(entry.reached, moves, positions, names, self._name)
            if refused is not None:
                return refused
        # Kept where the call's arrays were seen before this call: arrays new
        # each call would fill the entry with rebindings never made again.
        keep = seen is not None and seen.again and entry.seen is not None
        try:
            transition = entry.graph._move(pairs, moves, strict=False, record=True, keep=keep)
        except (FixedNodesError, OperandsError) as exc:
            return exc
        if transition is not None:
            if len(entry.transitions) >= _TRANSITIONS:
                del entry.transitions[next(iter(entry.transitions))]  # the oldest
            entry.transitions[key] = (tuple(positions), transition)
        entry.bind(values, spans, seen)
        cache.rebinds += 1
        return None

    def _signature(self, cache: _Cache, values: tuple, nargs: int, keys: tuple,
                   recent: _Seen | None = None,
                   searched: bool = False) -> tuple[tuple, dict[int, tuple], _Seen | None]:
        """A call's signature, ``(pointer, start, end)`` of each distinct
        array by its first position, and the :class:`_Seen`
        that knows these values (None where their memory may change). The signature ends with
        the keywords and which array arguments are the same object (the
        graph was recorded with them shared). Distinct arrays that share
        memory are refused: a rebinding moves each array's memory alone.

        A call with the objects of one of the latest calls has that call's
        signature and spans, as long as its arrays are of types whose layout
        and memory are fixed for their life: ``recent``, where the latest
        calls were ``searched`` already."""
        if not searched:
            recent = _recent(cache, values, keys)
        if recent is not None:
            return recent.sig, recent.spans, recent
        # An array the latest call had at the same place, the same object,
        # keeps that call's part of the signature and span.
        latest = cache.seen[0] if cache.seen else None
        kept: list[bool] = []
        if latest is not None and latest.keys == keys and len(latest.held) == len(values):
            kept = [type(h) is not tuple and v is not None and h() is v  # type: ignore[operator]
                    for h, v in zip(latest.held, values)]
            sig = tuple(latest.sig[i] if kept[i] else _signature_of(v, i, nargs, keys)
                        for i, v in enumerate(values))
            known = latest.spans
        else:
            sig = tuple(_signature_of(v, i, nargs, keys) for i, v in enumerate(values))
            known = {}
        first: dict[int, int] = {}
        spans = {}
        shared = []
        fixed = True
        for i, s in enumerate(sig):
            if s[0] == _VALUE:
                continue
            value = values[i]
            j = first.setdefault(id(value), i)
            shared.append(j)
            if j == i:
                found = known.get(i) if kept and kept[i] else None
                spans[i] = span(device_array_of(value)) if found is None else found
                fixed = fixed and type(value) in _FIXED
        if len(spans) > 1:
            ordered = sorted((s[1], s[2], i) for i, s in spans.items() if s[2] > s[1])
            for (_, end, i), (start, _, k) in zip(ordered, ordered[1:]):
                if start < end:
                    raise GraphedError(
                        f"arguments {_name_of(min(i, k), nargs, keys)} and "
                        f"{_name_of(max(i, k), nargs, keys)} are different arrays over "
                        "the same memory; a graphed function rebinds each argument on "
                        "its own. Pass the array once and take its views inside the "
                        "function")
        sig += (keys, tuple(shared))
        if not fixed:
            return sig, spans, None
        made = _Seen(values, keys, sig, spans)
        cache.seen.insert(0, made)
        dropped = cache.seen[_SEEN:]
        if dropped:
            del cache.seen[_SEEN:]
            _forget_seen(cache, dropped, self._name)
        return sig, spans, made

    def _capture(self, cache: _Cache, sig: tuple, stream: Any, args: tuple, kwargs: dict,
                 values: tuple, spans: dict[int, tuple], seen: _Seen | None, names: list[str],
                 before: int | None = None) -> _Entry:
        warm = _resize.family_of(sig) if self._sizes else sig
        if before is None:
            before = cache.warm.get(warm, 0)  # the warm-up calls
        entry = self._captured(sig, stream, args, kwargs, values, spans, seen, before)
        # One graph for many sizes is one graph for many arrays too.
        entry.twinless = self._sizes
        cache.entries[sig] = entry
        if self._sizes:
            family = _resize.family_of(sig)
            cache.families[family] = [entry, *cache.families.get(family, ())]
        cache.warm.pop(warm, None)
        cache.captures += 1
        if cache.graphs() > self._max:
            # Twins go before any signature's graph, the least recently used
            # signature's first, each signature's oldest first.
            why = (f"the graph of {self._name}() for arrays that came back, closed to "
                   f"hold at most max_graphs={self._max}")
            for held in list(cache.entries.values()):
                while held.twins and cache.graphs() > self._max:
                    _drop_twin(cache, held.twins.pop(0), why)
        if len(cache.entries) > self._max:
            old_sig, old = cache.entries.popitem(last=False)
            cache.forget(old)
            why = (f"the graph of {self._name}() for a signature its cache evicted "
                   f"(max_graphs={self._max})")
            _drop_twins(cache, old, why)
            _let_go(cache, old, why)
            cache.evictions += 1
            warnings.warn(
                f"{self._name}() captured a graph for a new signature and closed the "
                f"least recently used one, holding at most max_graphs={self._max}; "
                f"{self._difference(old_sig, sig, names)}. Calls that keep bringing new "
                "signatures capture every time: pass per-call values in DeviceScalars "
                "and keep array layouts fixed, or raise max_graphs",
                GraphedWarning, stacklevel=4)
        return entry

    def _captured(self, sig: tuple, stream: Any, args: tuple, kwargs: dict, values: tuple,
                  spans: dict[int, tuple], seen: _Seen | None, before: int) -> _Entry:
        """The call captured: an entry of ``sig``, bound to its values."""
        # What the function reaches besides its arguments, before and after
        # it ran: a run may rebind a global or a closure's cell.
        reached_before = reached(self._fn, len(args), list(kwargs))
        try:
            with capture(stream) as cap:
                result = self._fn(*args, **kwargs)
        except AllocationInCaptureError as exc:
            raise AllocationInCaptureError(
                f"{exc}. {self._name}() is graphed: make the array once, outside "
                "the function, and pass it as an argument") from exc
        graph = cap.graph
        try:
            plan = _result_plan(result, values, graph._res.memory, self._name, before)
        except GraphedError:
            graph.close()
            raise
        entry = _Entry(graph, values, spans, plan, before, sig, seen)
        entry.reached = list(dict.fromkeys(
            reached_before + reached(self._fn, len(args), list(kwargs))))
        return entry

    def _twin(self, cache: _Cache, seen: _Seen, stream: Any, args: tuple, kwargs: dict,
              keys: tuple, values: tuple, depth: int) -> _Entry | None:
        """The call, of values a remembered call was given that came back to
        a graph bound to others: captured again, into a graph bound to them
        for good, launched whenever they come back while they are
        remembered (instead of rebinding one graph to and fro); its entry.
        None where the capture failed: the signature's entry makes no more
        twins, and the call is made by rebinding that entry's graph (a
        warning says why, ``depth`` frames above this one)."""
        sig = seen.sig
        generation = cache.generation
        try:
            twin = self._captured(sig, stream, args, kwargs, values, seen.spans, seen, 0)
        except Exception as exc:  # noqa: BLE001  the graph kept serves the call
            entry = cache.entries.get(sig)
            if entry is not None:
                entry.twinless = True
            reason = f"twin: {type(exc).__name__}: {exc}"
            if reason not in self._warned:
                self._warned.add(reason)
                warnings.warn(
                    f"{self._name}() could not capture a graph of its own for arrays that "
                    f"came back ({type(exc).__name__}: {exc}); its graph is rebound to "
                    "them instead, as it is from now on", GraphedWarning,
                    stacklevel=depth + 1)
            return None
        cache.captures += 1
        entry = cache.entries.get(sig)
        if entry is None or cache.generation != generation:
            # The function cleared its own cache while it was captured.
            twin.launch()
            _close(twin, f"the graph of {self._name}() captured while it was cleared")
            return twin
        entry.twins.append(twin)
        seen.twin = twin
        cache.twins += 1
        return _armed(cache, twin, values, keys)

    def _resize(self, cache: _Cache, sig: tuple, stream: Any, args: tuple, kwargs: dict,
                values: tuple, spans: dict[int, tuple],
                seen: _Seen | None) -> tuple[_Entry | None, bool]:
        """A graph of the call's family (the latest used first) given the
        call's sizes and arrays by node updates, now kept under ``sig``;
        None, after a GraphedWarning naming why, where none can take them
        (the call is captured), or where the family has no graph yet; and
        whether the function ran."""
        family = _resize.family_of(sig)
        # Every graph a family lists is in the cache: one leaves both at once
        # (Cache.forget).
        held = cache.families.get(family)
        if not held:
            return None, False
        handle = self._handle if self._handle is not None else _backend.stream_handle(stream)
        plans: list = []

        def accept(result: Any) -> None:
            # The result is an argument or None: no graph memory to make it from.
            plans.append(_result_plan(result, values, None, self._name))

        taken, reason = _resize.rerun([e.graph for e in held], self._fn, args, kwargs, stream,
                                      handle, accept)
        if reason is None:
            entry = held[taken]
            del cache.entries[entry.sig]
            entry.sig, entry.result = sig, plans[0]
            entry.bind(values, spans, seen)
            entry.transitions.clear()  # made for other sizes
            # The run the nodes hold now.
            entry.reached = reached(self._fn, len(args), list(kwargs))
            cache.entries[sig] = entry
            cache.families[family] = [entry, *(e for e in held if e is not entry)]
            cache.resizes += 1
            return entry, True
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(
                f"{self._name}() could not give its graph this call's sizes by node "
                f"updates, and captures it instead: {reason}. sizes='update' re-sizes "
                "work whose kernel launches, copies and fills stay the same, in number, "
                "order and kernel, from size to size",
                GraphedWarning, stacklevel=4)
        return None, True

    def _capture_again(self, cache: _Cache, sig: tuple, entry: _Entry, stream: Any,
                       args: tuple, kwargs: dict, keys: tuple, values: tuple,
                       spans: dict[int, tuple], seen: _Seen | None,
                       cublas: bool = True) -> _Entry:
        """Capture the signature of ``entry`` again, for a call whose arrays
        the graph cannot be rebound to: cuBLAS's kernels hold the addresses
        of the arrays they were given (numbagraph.ops._blas), or, without
        ``cublas``, an op refuses them."""
        del cache.entries[sig]
        cache.forget(entry)
        # The twins, bound to arrays of their own, go on with the new graph;
        # where it is not made, or the cache is cleared meanwhile, they go.
        twins, entry.twins = entry.twins, []
        generation = cache.generation
        try:
            memory = entry.graph._res.memory
            before = entry.before + (memory.launches if memory is not None else 0)
            _let_go(cache, entry, f"the graph of {self._name}() captured again for other "
                                  "arrays")
            if cublas and _CUBLAS_WARNING not in self._warned:
                self._warned.add(_CUBLAS_WARNING)
                warnings.warn(
                    f"{self._name}() calls cuBLAS (ng.matmul_into), whose kernels keep "
                    "the addresses of the arrays they were captured with: a call with "
                    "other arrays captures the function again instead of rebinding its "
                    "graph. Pass the same arrays from call to call, or run matmul_into's "
                    "numba kernel, which rebinds: ng.set_matmul_backend('numba')",
                    GraphedWarning, stacklevel=4)
            names = [_name_of(i, len(args), keys) for i in range(len(values))]
            again = self._capture(cache, sig, stream, args, kwargs, values, spans, seen,
                                  names, before)
        except BaseException:
            self._let_twins_go(cache, twins, generation)
            raise
        if cache.generation != generation:
            self._let_twins_go(cache, twins, generation)
        else:
            again.twins = twins
        return again

    def _let_twins_go(self, cache: _Cache, twins: list[_Entry], generation: int) -> None:
        """Close ``twins``, taken from an entry that is gone; a cache reset
        since ``generation`` counts them no more."""
        why = f"the graph of {self._name}() for arrays that came back, whose signature's graph went"
        for twin in twins:
            if cache.generation == generation:
                _drop_twin(cache, twin, why)
            else:
                if twin.seen is not None:
                    twin.seen.twin = None
                _close(twin, why)

    def _difference(self, old: tuple, new: tuple, names: list[str]) -> str:
        # A signature ends with the keywords and the arguments' sharing.
        for name, a, b in zip(names, old[:-2], new[:-2]):
            if a != b:
                return f"argument {name} differs: {self._show(a)} before, {self._show(b)} now"
        return "the arguments differ in number, keywords or sharing"

    @staticmethod
    def _show(sig: tuple) -> str:
        if sig[0] == _VALUE:
            return repr(_value_of(sig))
        if sig[0] == "scalar":
            return f"a DeviceScalar of {np.dtype(sig[2])}"
        return f"an array of shape {sig[2]}, dtype {np.dtype(sig[3])}, strides {sig[4]}"

    def _warn_if_values_change(self, last: tuple | None, sig: tuple, names: list[str]) -> None:
        """A new signature that differs from the last call's only in plain
        values: most likely a per-step value, which captures a graph per
        value."""
        if last is None or len(last) != len(sig) or last[-2:] != sig[-2:]:
            return
        changed = [i for i, (a, b) in enumerate(zip(last[:-2], sig[:-2])) if a != b]
        if not changed or any(sig[i][0] != _VALUE or last[i][0] != _VALUE for i in changed):
            return
        if changed[0] in self._warned:
            return
        self._warned.add(changed[0])
        warnings.warn(
            f"{self._name}(): argument {names[changed[0]]} changed from "
            f"{_value_of(last[changed[0]])!r} to {_value_of(sig[changed[0]])!r}; plain "
            "values are part of "
            "a call's signature, so each new value runs and captures the function "
            "again. Pass a value that changes per call in a DeviceScalar "
            "(ng.DeviceScalar) and update it before the call",
            GraphedWarning, stacklevel=4)

    def cache_info(self) -> GraphedCacheInfo:
        """What the cache did, summed over its streams.

        Returns
        -------
        GraphedCacheInfo
            hits, captures, rebinds, evictions, eager calls, graphs held,
            and ``max_graphs``.
        """
        with self._lock:
            caches = list(self._caches.values())
        return GraphedCacheInfo(
            sum(c.hits for c in caches), sum(c.captures for c in caches),
            sum(c.rebinds for c in caches), sum(c.evictions for c in caches),
            sum(c.eager for c in caches), sum(c.graphs() for c in caches), self._max,
            sum(c.resizes for c in caches))

    def clear(self) -> None:
        """Close every graph and forget every signature and count."""
        with self._lock:
            caches = list(self._caches.items())
            # A cache another thread holds stays in place, emptied under its
            # lock: that thread's call captures into it, not into one no
            # later clear() would find. The caches of the per-thread default
            # stream of threads that ended go.
            for key, _ in caches:
                thread = key[1] if isinstance(key, tuple) else None
                if isinstance(thread, threading.Thread) and not thread.is_alive():
                    del self._caches[key]
            self._warned.clear()
        for _, cache in caches:
            with cache.lock:
                for entry in cache.entries.values():
                    for twin in entry.twins:
                        _close(twin, f"the graph of {self._name}() that clear() closed")
                    _close(entry, f"the graph of {self._name}() that clear() closed")
                cache.reset()

    def __repr__(self) -> str:
        info = self.cache_info()
        return (f"<graphed {self._name}: {info.graphs} graphs, {info.hits} hits, "
                f"{info.captures} captures>")


def graphed(fn: Callable[..., Any] | None = None, *, stream: Any = None, warmup: int = 1,
            max_graphs: int = 16, sizes: str = "capture") -> Any:
    """Make ``fn``, a function of kernel launches and ops on one stream, replay
    as a CUDA graph.

    A call's signature is, per argument, the kind, shape, dtype and strides
    of a device array or DeviceScalar (not its address), and the value of
    anything else (which must be hashable). The first ``warmup`` calls of a
    signature run ``fn`` as written (compiling its kernels); the next one
    captures it into a graph and launches that. A later call of a known
    signature rebinds the graph to the arrays it is given (without capturing
    or instantiating again) when they differ from the ones the graph holds,
    and launches it; a call with the same arrays launches it at once. Arrays
    that take turns (a ping-pong, a ring of up to four sets) get a graph of
    their own each, captured when a set comes back to a graph bound to
    another, and launched with nothing rebound while the function holds
    fewer than ``max_graphs`` graphs (unless it allocates graph memory or
    gives its graphs new sizes).
    Arrays the function allocates inside (``ng.empty`` and its kin) are
    memory of its graph; one it returns is returned as a new array object
    at each call, valid until the next call of that signature.
    Values that change per call belong in DeviceScalars: a changed plain
    value is a new signature, captured anew.

    With ``sizes="update"``, one graph serves every shape of the same work:
    a call whose arrays differ from a kept graph's only in shape and
    strides (the same kinds, dtypes, ranks and layouts) runs ``fn``'s Python
    again without launching anything, takes its kernel launches (grids,
    blocks, shared memory, arguments) and numbagraph's own copies and
    fills, and sets them on that graph's nodes, one for one, before
    launching it; ``cache_info().resizes`` counts such calls. Where the
    work differs in number, kind or kernel, or holds anything else (graph
    memory, a host call, a device loop, cuBLAS), the call is captured as
    with ``sizes="capture"``, after a GraphedWarning naming the first
    difference.

    Each stream has its own cache of at most ``max_graphs`` graphs, least
    recently used first out, and its own lock: threads calling on their own
    streams run side by side; calls on one stream take turns. Called while
    its stream captures, the function runs as written and its launches join
    that capture.

    Parameters
    ----------
    fn
        The function; omitted when used as ``@ng.graphed(...)``.
    stream
        The stream the function launches on. When None, every call passes
        ``stream=s``, which is passed on to the function.
    warmup
        Calls of a new signature run as written before it is captured.
    max_graphs
        Graphs kept per stream: a signature's, and those of arrays that take
        turns (1: one graph, rebound from set to set).
    sizes
        ``"capture"``: a graph per signature, shapes included. ``"update"``:
        a new shape of known work updates the graph kept for it.

    Returns
    -------
    GraphedFunction
        The function, callable as before.

    Raises
    ------
    GraphedError
        At a call: an argument that cannot be part of a signature (a host
        array, an unhashable value), distinct arrays over one memory, no
        stream, or a result that is neither an argument nor an array the
        function allocated (and did not free) inside its capture.
    AllocationInCaptureError
        At a capture: the function allocates device memory for another
        stream than its own (for its own stream, or with none named, the
        arrays are memory of the graph).
    StaleOutputError
        Later, when an array a call returned is used after a later call
        launched the same graph again, which overwrote it.

    Warns
    -----
    GraphedWarning
        A plain argument changed between calls, a capture closed the
        least recently used graph, (``sizes="update"``) a call's work
        could not be given to a kept graph by node updates, or a call was
        captured again because the array it replaces is memory the
        function also reaches another way (its closure, a default, a
        global, ``self``).

    Examples
    --------
    ```python
    @ng.graphed(stream=s)
    def step(y, y_next, dt):
        advance[4, 256, s](y, y_next, dt)
        return y_next

    for _ in range(4):
        step(a, b, dt)       # run as written, then captured into a graph of its own
        step(b, a, dt)       # captured, then replayed: each pair has its graph
    ```
    """
    if fn is None:
        return functools.partial(graphed, stream=stream, warmup=warmup, max_graphs=max_graphs,
                                 sizes=sizes)
    return GraphedFunction(fn, stream, warmup, max_graphs, sizes)
