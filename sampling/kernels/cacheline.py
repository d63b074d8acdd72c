"""Numba intrinsics for software prefetch: start fetching one array element's cache line."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _prefetch_intrinsic(write: int):
    def impl(typingctx, array, index):
        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
            ptr = builder.bitcast(ptr, ir.IntType(8).as_pointer())  # one declaration for every element type
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [ptr, i32(write), i32(3), i32(1)])  # keep in every cache level; data
            return context.get_dummy_value()

        return types.void(array, index), codegen

    impl.__name__ = impl.__qualname__ = "prefetch_write" if write else "prefetch"
    return intrinsic(impl)


# ``prefetch(array, i)`` for data only read (shared pages stay shared); ``prefetch_write`` for data
# about to be written. Either is only a hint: it never faults, whatever the index.
prefetch = _prefetch_intrinsic(0)
prefetch_write = _prefetch_intrinsic(1)
