"""The soak's kernels: integer arithmetic only, so that every result has one
right answer the host can compute exactly."""

from __future__ import annotations

import numbagraph as ng  # noqa: I001  (picks the backend before numba.cuda loads)

from numba import cuda

__all__ = ["bump", "advance", "mix", "mix_reference", "zero", "count_below", "PRIME"]

PRIME = 2_147_483_647
"""Modulus of :func:`mix`: below 2**31, so ``acc * 31 + pos + salt`` fits int64."""
_MULTIPLIER = 31


@cuda.jit
def bump(x, step):
    """x[i] += step[0]."""
    i = cuda.grid(1)
    if i < x.size:
        x[i] += step[0]


@cuda.jit
def advance(src, dst, step):
    """dst[i] = src[i] + step[0]."""
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i] + step[0]


@cuda.jit
def mix(acc, pos, salt):
    """acc[i] = (31 acc[i] + pos[0] + salt[0] + i) mod PRIME: each replay's
    result depends on every earlier one and on the order of the updates, so a
    lost, repeated or reordered update changes the final value."""
    i = cuda.grid(1)
    if i < acc.size:
        acc[i] = (acc[i] * 31 + pos[0] + salt[0] + i) % 2_147_483_647


class mix_reference:
    """The host's model of ``acc`` after ``nodes`` launches of :func:`mix`
    per replay, with ``acc`` zero at first.

    Element ``i`` is ``b + i * d`` (mod PRIME): one node maps ``b`` to
    ``31 b + c`` and ``d`` to ``31 d + 1``, so a replay of ``nodes`` nodes is
    one affine map of each, applied per replay in O(1).
    """

    def __init__(self, nodes: int):
        self.scale = pow(_MULTIPLIER, nodes, PRIME)
        self.shift = sum(pow(_MULTIPLIER, k, PRIME) for k in range(nodes)) % PRIME
        self.base = 0
        self.step = 0

    def replay(self, pos: int, salt: int) -> None:
        self.base = (self.scale * self.base + self.shift * (pos + salt)) % PRIME
        self.step = (self.scale * self.step + self.shift) % PRIME

    def expected(self, size: int) -> list[int]:
        return [(self.base + i * self.step) % PRIME for i in range(size)]


@cuda.jit
def zero(x):
    """x[i] = 0."""
    i = cuda.grid(1)
    if i < x.size:
        x[i] = 0


@cuda.jit
def count_below(counter, limit, more):
    """counter += 1, and keep ``more`` set while counter < limit."""
    if cuda.grid(1) == 0:
        counter[0] += 1
        ng.set_condition(more, counter[0] < limit[0])
