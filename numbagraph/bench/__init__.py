"""Benchmarks: numbagraph side by side with eager Numba, the raw driver
(cuda.core, cuda.bindings, ctypes), PyTorch, CuPy and CUDA C++.

Run ``python -m numbagraph.bench --out DIR`` (or ``numbagraph-bench``).
Suites, in the order they run:

* ``replay``    replay cost per node of graphs of 1..1000 tiny kernels
* ``eager``     launch cost of one tiny kernel, eagerly, per framework
* ``loop``      a replay-loop step: scalar update + 1-node graph launch
* ``devloop``   loops run by the GPU: while and if nodes, unrolled passes
* ``capture``   capture + instantiate cost, per launch captured
* ``graphed``   a call of an ``ng.graphed`` step, arrays the same or changed
* ``sizes``     one graph for many sizes: ``ng.graphed(sizes="update")``
* ``memory``    graph-owned temporaries: replay, footprint, capture cost
* ``streams``   forked streams, child graphs, host nodes, pinned read-backs
* ``bandwidth`` effective bandwidth of the ``_into`` ops on 1 GiB float32
* ``ops``       time per call of matmul, matvec, softmax, norms, max, take
* ``apps``      the examples' own eager vs graph timings
* ``dist``      NCCL's all-reduce in a step's graph or eager, bus bandwidth

The tiny kernel is ``a[i] += n[0]`` on 1024 float32 in every framework.
Peers that are missing (PyTorch, CuPy, nvcc, matplotlib, the CUDA driver)
are reported with the reason and skipped.
"""

from . import (apps, bandwidth, capture_cost, collectives, devloop, eager, graphed, loop,
               memory, ops, replay, sizes, streams)

__all__ = ["SUITES"]

SUITES = {
    m.NAME: m for m in (replay, eager, loop, devloop, capture_cost, graphed, sizes, memory,
                     streams, bandwidth, ops, apps, collectives)
}
