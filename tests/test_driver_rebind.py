"""The driver's rebinding index, its host side: parameter buffers, the
pointer index, planning, applying and undoing. Node updates are stood in for,
so this runs where there is no GPU; test_rebind.py runs the real thing."""

import ctypes

import pytest
from cuda.bindings import driver as cu

from numbagraph.backend import driver_base, driver_rebind
from numbagraph.backend.interface import Move


class Kernel(driver_rebind._Kernel):
    """A kernel entry whose node update is recorded, or refused on demand."""

    __slots__ = ("sets", "refuse")

    def set_on(self, graph_exec, ctx):
        if getattr(self, "refuse", False):
            raise driver_base.DriverError.__new__(driver_base.DriverError)
        self.sets = getattr(self, "sets", 0) + 1


def words(*values):
    return b"".join(v.to_bytes(8, "little") for v in values)


def kernel(*values, refuse=False):
    """An entry with one 8-byte parameter per value, and a 4-byte one last."""
    layout = [(8 * i, 8) for i in range(len(values))] + [(8 * len(values), 4)]
    entry = Kernel(None, cu.CUDA_KERNEL_NODE_PARAMS(), words(*values) + b"\1\0\0\0", layout)
    entry.refuse = refuse
    return entry


class Index(driver_rebind.NodeIndex):
    """A NodeIndex of the entries given, read from no graph."""

    def __init__(self, *entries):
        self.entries = list(entries)
        self._holders = None
        self.generation = 0
        self.graph_exec = self.ctx = None


def values(entry):
    return [entry.read(slot) for slot in entry.slots]


def test_a_kernel_entry_holds_its_parameters_and_points_the_node_at_them():
    entry = kernel(1000, 2000)
    assert entry.slots == [0, 1]        # the 4-byte parameter is no pointer
    assert values(entry) == [1000, 2000]
    entry.write(1, 2048)
    pointers = ctypes.cast(entry.params.kernelParams, ctypes.POINTER(ctypes.c_void_p))
    assert ctypes.c_uint64.from_address(pointers[1]).value == 2048
    twin = entry.twin(None)
    twin.write(0, 7)
    assert values(entry) == [1000, 2048] and values(twin) == [7, 2048]


def test_a_plan_moves_every_holder_of_a_value_once_and_marks_what_it_used():
    a, b = kernel(1000, 5000), kernel(1004, 1000)
    index = Index(a, b)
    plan = index.plan([Move(1000, 1008, 500, None), Move(9000, 9008, 1, None)])
    assert plan.used == [True, False]
    plan.apply()
    assert values(a) == [1500, 5000] and values(b) == [1504, 1500]
    assert (a.sets, b.sets) == (1, 1)
    assert sorted(index.holders) == [1500, 1504, 5000]


def test_a_move_onto_the_same_memory_sets_no_node():
    a, b = kernel(1000, 5000), kernel(5000)
    index = Index(a, b)
    plan = index.plan([Move(1000, 1008, 0, None), Move(5000, 5008, 8, None)])
    assert plan.used == [True, True]
    plan.apply()
    assert values(a) == [1000, 5008] and values(b) == [5008]
    assert (a.sets, b.sets) == (1, 1)
    plan = index.plan([Move(1000, 1008, 0, None)])
    assert plan.used == [True]
    plan.apply()
    assert (a.sets, b.sets) == (1, 1) and sorted(index.holders) == [1000, 5008]
    assert index.redo(plan.change) and (a.sets, b.sets) == (1, 1)


def test_swapped_values_trade_places_in_the_index():
    a = kernel(1000, 2000)
    index = Index(a)
    for _ in range(3):
        driver_rebind._Plan(index, [Move(1000, 1008, 1000, None),
                                    Move(2000, 2008, -1000, None)]).apply()
        assert sorted(index.holders) == [1000, 2000]
    assert values(a) == [2000, 1000]
    assert index.holders[2000] == [(a, 0)]


def test_a_refused_node_update_sets_every_node_back():
    a, b = kernel(1000), kernel(1000, refuse=True)
    index = Index(a, b)
    with pytest.raises(driver_base.DriverError):
        driver_rebind._Plan(index, [Move(1000, 1008, 8, None)]).apply()
    assert values(a) == [1000] and values(b) == [1000]
    assert a.sets == 2                  # set once, then set back
    assert sorted(index.holders) == [1000]


def test_a_change_made_again_sets_the_nodes_it_changed_to_where_it_left_them():
    a, b, c = kernel(1000, 5000), kernel(1004, 7000), kernel(5000)
    index = Index(a, b, c)
    there = index.plan([Move(1000, 1008, 500, None)])
    there.apply()
    back = index.plan([Move(1500, 1508, -500, None)])
    back.apply()
    assert values(a) == [1000, 5000] and values(b) == [1004, 7000]
    for _ in range(3):
        assert index.redo(there.change)
        assert values(a) == [1500, 5000] and values(b) == [1504, 7000] and values(c) == [5000]
        assert sorted(index.holders) == [1500, 1504, 5000, 7000]
        assert index.redo(back.change)
        assert values(a) == [1000, 5000] and values(b) == [1004, 7000]
        assert sorted(index.holders) == [1000, 1004, 5000, 7000]
    assert (a.sets, b.sets, c.sets if hasattr(c, "sets") else 0) == (8, 8, 0)
    assert index.holders[1000] == [(a, 0)] and index.holders[5000] == [(a, 1), (c, 0)]


def test_a_change_is_not_made_again_on_nodes_that_hold_other_pointers():
    a, b = kernel(1000, 5000), kernel(5000)
    index = Index(a, b)
    there = index.plan([Move(1000, 1008, 4000, None)])   # a's first array onto b's
    there.apply()
    index.plan([Move(5000, 5008, -4000, None)]).apply()  # both back onto a's
    assert values(a) == [1000, 1000] and values(b) == [1000]
    assert not index.redo(there.change)
    assert values(a) == [1000, 1000] and values(b) == [1000]


def test_a_change_no_longer_applies_once_nodes_were_set_otherwise():
    a = kernel(1000)
    index = Index(a)
    plan = index.plan([Move(1000, 1008, 8, None)])
    plan.apply()
    index.generation += 1        # as setting nodes whole (new sizes) does
    assert not index.redo(plan.change)
    assert not Index(kernel(1000)).redo(plan.change)
    assert values(a) == [1008] and a.sets == 1


def test_a_change_is_not_made_again_where_other_nodes_came_to_hold_what_it_moves():
    a, b = kernel(1000), kernel(5000)
    index = Index(a, b)
    there = index.plan([Move(1000, 1008, 500, None)])
    there.apply()
    index.plan([Move(5000, 5008, -4000, None)]).apply()   # b onto 1000
    index.plan([Move(1500, 1508, -500, None)]).apply()    # a back onto 1000
    assert values(a) == [1000] and values(b) == [1000]
    assert not index.redo(there.change)
    assert values(a) == [1000] and values(b) == [1000]
    assert sorted(index.holders) == [1000]


def test_kernel_nodes_are_made_again_through_the_driver_call_itself(monkeypatch):
    sets, refused = [], set()

    def set_kernel(graph_exec, node, params):
        sets.append(node)
        return (1 if node in refused else 0,)

    class Refused(driver_base.DriverError):
        def __init__(self, *args):   # named without asking the driver
            Exception.__init__(self, *args)

    monkeypatch.setattr(driver_rebind, "_set_kernel", set_kernel)
    monkeypatch.setattr(driver_rebind, "DriverError", Refused)
    layout = [(0, 8), (8, 8)]
    a, b = (driver_rebind._Kernel(name, cu.CUDA_KERNEL_NODE_PARAMS(), words(1000, 7), layout)
            for name in ("a", "b"))
    index = Index(a, b)
    there = index.plan([Move(1000, 1008, 64, None)])
    there.apply()
    index.plan([Move(1064, 1072, -64, None)]).apply()
    sets.clear()
    assert index.redo(there.change)
    assert sets == ["a", "b"] and values(a) == [1064, 7] and values(b) == [1064, 7]
    pointers = ctypes.cast(a.params.kernelParams, ctypes.POINTER(ctypes.c_void_p))
    assert ctypes.c_uint64.from_address(pointers[0]).value == 1064
    index.plan([Move(1064, 1072, -64, None)]).apply()
    refused.add("b")
    sets.clear()
    with pytest.raises(driver_base.DriverError):
        index.redo(there.change)
    assert sets == ["a", "b", "a"]      # a set, b refused, a set back
    assert values(a) == [1000, 7] and values(b) == [1000, 7]


def test_a_refused_node_while_a_change_is_made_again_sets_every_node_back():
    a, b = kernel(1000), kernel(1000, 3000)
    index = Index(a, b)
    plan = index.plan([Move(1000, 1008, 8, None)])
    plan.apply()
    index.plan([Move(1008, 1016, -8, None)]).apply()
    holders = {value: list(refs) for value, refs in index.holders.items()}
    b.refuse = True
    with pytest.raises(driver_base.DriverError):
        index.redo(plan.change)
    assert values(a) == [1000] and values(b) == [1000, 3000]
    assert a.sets == 4                  # twice by plans, then set and set back
    assert index.holders == holders
    b.refuse = False
    assert not index.redo(plan.change)  # a refusal leaves no change to make again


class Memset(driver_rebind._Memset):
    __slots__ = ("sets", "refuse")

    def set_on(self, graph_exec, ctx):
        if getattr(self, "refuse", False):
            raise driver_base.DriverError.__new__(driver_base.DriverError)
        self.sets = getattr(self, "sets", 0) + 1


class Memcpy(driver_rebind._Memcpy):
    __slots__ = ("sets", "refuse")

    def set_on(self, graph_exec, ctx):
        if getattr(self, "refuse", False):
            raise driver_base.DriverError.__new__(driver_base.DriverError)
        self.sets = getattr(self, "sets", 0) + 1


def memset(dst):
    params = cu.CUDA_MEMSET_NODE_PARAMS()
    params.dst, params.width, params.height, params.elementSize = dst, 64, 1, 1
    return Memset(None, params)


def memcpy(src, dst):
    params = cu.CUDA_MEMCPY3D()
    device = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    params.srcMemoryType = params.dstMemoryType = device
    params.srcDevice, params.dstDevice = src, dst
    params.WidthInBytes, params.Height, params.Depth = 64, 1, 1
    return Memcpy(None, params)


def test_copies_and_fills_are_made_again_with_kernels():
    k, f, c = kernel(1000, 3000), memset(1000), memcpy(3000, 1016)
    index = Index(k, f, c)
    there = index.plan([Move(1000, 1064, 4096, None)])
    there.apply()
    back = index.plan([Move(5096, 5160, -4096, None)])
    back.apply()
    assert values(k) == [1000, 3000] and values(f) == [1000] and values(c) == [3000, 1016]
    assert index.redo(there.change)
    assert values(k) == [5096, 3000] and values(f) == [5096] and values(c) == [3000, 5112]
    assert int(c.params.srcDevice) == 3000 and int(c.params.dstDevice) == 5112
    assert int(f.params.dst) == 5096 and int(f.params.width) == 64
    assert (k.sets, f.sets, c.sets) == (3, 3, 3)
    assert sorted(index.holders) == [3000, 5096, 5112]


def fill_and_copy_moved_there_and_back():
    """A fill and a copy, and the changes of moving 1000 to 5096 and back."""
    f, c = memset(1000), memcpy(3000, 1016)
    index = Index(f, c)
    there = index.plan([Move(1000, 1064, 4096, None)])
    there.apply()
    back = index.plan([Move(5096, 5160, -4096, None)])
    back.apply()
    return f, c, index, there, back


def test_copies_and_fills_made_again_hold_parameters_made_ready_once_and_copy_them_to_write():
    f, c, index, there, back = fill_and_copy_moved_there_and_back()
    for _ in range(3):
        assert index.redo(there.change) and index.redo(back.change)
    assert index.redo(there.change)
    ready = there.change.prepared
    assert f.params is ready[0] and c.params is ready[1]
    assert values(f) == [5096] and values(c) == [3000, 5112]
    # A rebinding worked out writes into copies: what the change set stays.
    index.plan([Move(5096, 5160, 8192, None)]).apply()
    assert values(f) == [13288] and values(c) == [3000, 13304]
    assert f.params is not ready[0] and c.params is not ready[1]
    assert int(ready[0].dst) == 5096 and int(ready[1].dstDevice) == 5112
    assert f.pointers() == (13288,) and c.pointers() == (3000, 13304)
    assert not index.redo(back.change)     # the nodes hold other pointers now


def test_a_copy_refused_while_made_again_sets_every_node_back_and_keeps_what_was_ready():
    f, c, index, there, back = fill_and_copy_moved_there_and_back()
    assert index.redo(there.change) and index.redo(back.change)
    ready = there.change.prepared
    c.refuse = True
    with pytest.raises(driver_base.DriverError):
        index.redo(there.change)
    assert values(f) == [1000] and values(c) == [3000, 1016]
    assert f.params is not ready[0] and c.params is not ready[1]
    assert int(ready[0].dst) == 5096 and int(ready[1].dstDevice) == 5112
    assert not index.redo(there.change)          # refused: the change no longer applies
    # New sizes written into an entry that holds prepared parameters: a copy.
    f.hold(ready[0], (5096,))
    f.assign((7000, 32))
    assert int(ready[0].dst) == 5096 and int(f.params.dst) == 7000
    assert f.pointers() == (7000,) and int(f.params.width) == 32


def test_a_twin_of_entries_holding_ready_parameters_writes_into_its_own():
    f, c, index, there, back = fill_and_copy_moved_there_and_back()
    assert index.redo(there.change)
    ready = there.change.prepared
    assert f.params is ready[0] and c.params is ready[1]
    for entry, made in ((f, ready[0]), (c, ready[1])):
        twin = entry.twin(None)
        assert twin.params is not made and twin.pointers() == entry.pointers()
        slot = twin.slots[-1]
        twin.write(slot, 9000)
        assert twin.read(slot) == 9000
        # The entry, and the parameters its change makes again, are unchanged.
        assert entry.read(slot) != 9000 and int(getattr(made, slot)) != 9000
    assert index.redo(back.change)
    assert values(f) == [1000] and values(c) == [3000, 1016]


def test_a_packed_parameter_buffer_is_found_in_extra():
    packed = ctypes.create_string_buffer(words(3, 4))
    size = ctypes.c_size_t(16)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(packed), 2, ctypes.addressof(size), 0)
    assert driver_rebind._packed(ctypes.addressof(extra)) == ctypes.addressof(packed)


def test_a_kernel_layout_is_read_until_the_driver_says_there_is_no_more(monkeypatch):
    calls = []

    def info(handle, index):
        calls.append(index)
        if index < 3:
            return cu.CUresult.CUDA_SUCCESS, 8 * index, 8
        return cu.CUresult.CUDA_ERROR_INVALID_VALUE, 0, 0

    monkeypatch.setattr(driver_rebind.cu, "cuFuncGetParamInfo", info)
    monkeypatch.setattr(driver_rebind, "_layouts", {})
    params = cu.CUDA_KERNEL_NODE_PARAMS()
    params.func = cu.CUfunction(0x1234)
    assert driver_rebind._layout(params) == [(0, 8), (8, 8), (16, 8)]
    assert driver_rebind._layout(params) == [(0, 8), (8, 8), (16, 8)]
    assert calls == [0, 1, 2, 3]        # read once per function
