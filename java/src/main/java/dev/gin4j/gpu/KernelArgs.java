package dev.gin4j.gpu;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * A kernel's argument list, built once and reused across launches: one native block holds every
 * argument at its C alignment, and a pointer array points at each (what cuLaunchKernel /
 * hipModuleLaunchKernel take). Setting a value writes into the block; launching allocates nothing.
 */
public final class KernelArgs {
    /** The C type of one argument: its size and alignment. */
    public record Type(String name, long size, long alignment) {
        public static final Type I32 = new Type("int32", 4, 4);
        public static final Type I64 = new Type("int64", 8, 8);
        public static final Type F32 = new Type("float", 4, 4);
        public static final Type F64 = new Type("double", 8, 8);
        public static final Type POINTER = new Type("pointer", 8, 8);

        /** A struct passed by value, of the given size and alignment. */
        public static Type struct(long size, long alignment) {
            if (size <= 0 || Long.bitCount(alignment) != 1) throw new IllegalArgumentException("struct of size " + size + " and alignment " + alignment + ": size must be > 0 and alignment a power of two");
            return new Type("struct(" + size + ")", size, alignment);
        }
    }

    private final Type[] types;
    private final long[] offsets;
    private final MemorySegment values;
    private final MemorySegment params;
    private long unset;

    private KernelArgs(Arena arena, Type... types) {
        if (types.length > 64) throw new IllegalArgumentException("at most 64 kernel arguments, got " + types.length);
        this.types = types.clone();
        this.offsets = new long[types.length];
        long off = 0, maxAlign = 8;
        for (int i = 0; i < types.length; i++) {
            off = (off + types[i].alignment() - 1) & -types[i].alignment();
            offsets[i] = off;
            off += types[i].size();
            maxAlign = Math.max(maxAlign, types[i].alignment());
        }
        this.values = arena.allocate(Math.max(off, 8), maxAlign);
        this.params = arena.allocate(ValueLayout.ADDRESS, Math.max(types.length, 1));
        for (int i = 0; i < types.length; i++) params.setAtIndex(ValueLayout.ADDRESS, i, values.asSlice(offsets[i]));
        this.unset = types.length == 64 ? -1L : (1L << types.length) - 1;
    }

    /** Argument slots for the given C types, living as long as {@code arena}. */
    public static KernelArgs of(Arena arena, Type... types) { return new KernelArgs(arena, types); }

    public int count() { return types.length; }

    private long slot(int index, Type expected) {
        if (index < 0 || index >= types.length) throw new IndexOutOfBoundsException("argument " + index + " does not exist: this list has " + types.length);
        Type t = types[index];
        if (t.size() != expected.size()) {
            throw new IllegalArgumentException("argument " + index + " is " + t.name() + ", not " + expected.name());
        }
        unset &= ~(1L << index);
        return offsets[index];
    }

    public KernelArgs setInt(int index, int value) { values.set(ValueLayout.JAVA_INT, slot(index, Type.I32), value); return this; }
    public KernelArgs setLong(int index, long value) { values.set(ValueLayout.JAVA_LONG, slot(index, Type.I64), value); return this; }
    public KernelArgs setFloat(int index, float value) { values.set(ValueLayout.JAVA_FLOAT, slot(index, Type.F32), value); return this; }
    public KernelArgs setDouble(int index, double value) { values.set(ValueLayout.JAVA_DOUBLE, slot(index, Type.F64), value); return this; }

    /** A raw device address (0 for a null pointer). */
    public KernelArgs setPointer(int index, long deviceAddress) { values.set(ValueLayout.JAVA_LONG, slot(index, Type.POINTER), deviceAddress); return this; }
    public KernelArgs setPointer(int index, DeviceBuffer buffer) { return setPointer(index, buffer.address()); }

    /** Copies a by-value struct's bytes (exactly the declared size) into its slot. */
    public KernelArgs setStruct(int index, MemorySegment bytes) {
        if (index < 0 || index >= types.length) throw new IndexOutOfBoundsException("argument " + index + " does not exist: this list has " + types.length);
        Type t = types[index];
        if (t.size() != bytes.byteSize()) throw new IllegalArgumentException("argument " + index + " is " + t.name() + " but " + bytes.byteSize() + " bytes were given");
        MemorySegment.copy(bytes, 0, values, offsets[index], bytes.byteSize());
        unset &= ~(1L << index);
        return this;
    }

    void checkComplete(String kernel) {
        if (unset != 0) throw new IllegalStateException("kernel " + kernel + ": argument " + Long.numberOfTrailingZeros(unset) + " was never set");
        if (!values.scope().isAlive()) throw new IllegalStateException("kernel " + kernel + ": the arena holding its arguments is closed");
    }

    MemorySegment params() { return params; }
}
