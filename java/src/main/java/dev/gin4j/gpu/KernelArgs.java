package dev.gin4j.gpu;

import java.lang.foreign.Arena;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * A kernel's argument list, built once and reused across launches: one native block holds every
 * argument at its C alignment, and a pointer array points at each (what cuLaunchKernel /
 * hipModuleLaunchKernel take). Setting a value writes into the block; launching allocates nothing.
 * <p>A kernel that takes one struct by value (the library's own kernels, whose structs are declared
 * in gin-kernels/abi/ and generated into {@code dev.gin4j.bindings.moe}, {@code .a2a} and
 * {@code .basic}), possibly after the {@code ncclDevComm}, gets {@link #ofStruct}: its fields are
 * written by name, through the generated accessors on {@link #struct()} and, for device buffers,
 * {@link #setPointerField}. {@link #of} lists positional arguments, for users' own kernels.
 */
public final class KernelArgs {
    /**
     * The C type of one argument: its size and alignment. The five constants are the scalar types
     * the typed setters write ({@link #setInt} an {@link #I32} slot, {@link #setPointer} a
     * {@link #POINTER} slot, ...); any other type is a by-value struct, written with
     * {@link #setStruct}.
     *
     * @param name the type's name, for messages
     * @param size the size in bytes, positive
     * @param alignment the alignment in bytes, a power of two
     */
    public record Type(String name, long size, long alignment) {
        /** A C {@code int32_t}: 4 bytes, 4-byte aligned. */
        public static final Type I32 = new Type("int32", 4, 4);
        /** A C {@code int64_t}: 8 bytes, 8-byte aligned. */
        public static final Type I64 = new Type("int64", 8, 8);
        /** A C {@code float}: 4 bytes, 4-byte aligned. */
        public static final Type F32 = new Type("float", 4, 4);
        /** A C {@code double}: 8 bytes, 8-byte aligned. */
        public static final Type F64 = new Type("double", 8, 8);
        /** A device pointer: 8 bytes, 8-byte aligned. */
        public static final Type POINTER = new Type("pointer", 8, 8);

        /** Checks the type: a name, a positive size and a power-of-two alignment. */
        public Type {
            if (name == null || name.isEmpty()) throw new IllegalArgumentException("a kernel argument type needs a name");
            if (size <= 0 || alignment <= 0 || Long.bitCount(alignment) != 1) {
                throw new IllegalArgumentException("kernel argument type '" + name + "' of size " + size + " and alignment " + alignment
                        + ": size must be > 0 and alignment a power of two");
            }
        }

        /**
         * A struct passed by value, of the given size and alignment.
         *
         * @param size the struct's size in bytes
         * @param alignment the struct's alignment in bytes, a power of two
         * @return the type
         */
        public static Type struct(long size, long alignment) {
            return new Type("struct(" + size + ")", size, alignment);
        }

        boolean isScalar() { return equals(I32) || equals(I64) || equals(F32) || equals(F64) || equals(POINTER); }
    }

    private final Type[] types;
    private final long[] offsets;
    private final MemorySegment values;
    private final MemorySegment params;
    private final DeviceBuffer[] buffers;  // the buffer each pointer slot was set from, for graph captures (null: a raw address)
    private final DeviceBuffer[] fieldBuffers;  // ofStruct: the buffer of each pointer field, by offset / 8
    private final int structIndex;  // ofStruct: the struct's slot (the last); -1 for a positional list
    private long unset;

    private KernelArgs(Arena arena, Type... types) { this(arena, -1, types); }

    private KernelArgs(Arena arena, int structIndex, Type... types) {
        if (types.length > 64) throw new IllegalArgumentException("at most 64 kernel arguments, got " + types.length);
        this.types = types.clone();
        for (int i = 0; i < types.length; i++) {
            if (this.types[i] == null) throw new IllegalArgumentException("kernel argument " + i + " has no type (null)");
        }
        this.offsets = new long[types.length];
        this.buffers = new DeviceBuffer[types.length];
        this.structIndex = structIndex;
        this.fieldBuffers = new DeviceBuffer[structIndex >= 0 ? (int) (types[structIndex].size() / 8) : 0];
        long off = 0, maxAlign = 8;
        for (int i = 0; i < this.types.length; i++) {
            Type t = this.types[i];
            off = (off + t.alignment() - 1) & -t.alignment();
            offsets[i] = off;
            off += t.size();
            maxAlign = Math.max(maxAlign, t.alignment());
        }
        this.values = arena.allocate(Math.max(off, 8), maxAlign);
        this.params = arena.allocate(ValueLayout.ADDRESS, Math.max(types.length, 1));
        for (int i = 0; i < types.length; i++) params.setAtIndex(ValueLayout.ADDRESS, i, values.asSlice(offsets[i]));
        this.unset = types.length == 64 ? -1L : (1L << types.length) - 1;
    }

    /**
     * Argument slots for the given C types, living as long as {@code arena}.
     *
     * @param arena the arena that holds the arguments' memory
     * @param types the C type of each argument, in order (at most 64)
     * @return the argument list, every slot still to be set
     */
    public static KernelArgs of(Arena arena, Type... types) { return new KernelArgs(arena, types); }

    /**
     * The argument of a kernel that takes exactly one struct by value, laid out as {@code layout}
     * (a generated layout such as {@code MoeGinDispatchArgs.layout()}). The struct starts zeroed
     * (null pointers, zero integers) and counts as set; the launch check compares its size with the
     * compiled parameter's.
     *
     * @param arena the arena that holds the arguments' memory
     * @param layout the struct's layout
     * @return the argument list
     */
    public static KernelArgs ofStruct(Arena arena, MemoryLayout layout) {
        return new KernelArgs(arena, 0, structType(layout)).markStructSet();
    }

    /**
     * The arguments of a kernel that takes {@code leading} (the {@code ncclDevComm} of the kernels
     * on NCCL's device API, set with {@link #setStruct setStruct(0, bytes)}) and then one struct by
     * value, laid out as {@code layout}: the struct starts zeroed and counts as set, and
     * {@link #struct()} and {@link #setPointerField} address it as for {@link #ofStruct(Arena, MemoryLayout)}.
     *
     * @param arena the arena that holds the arguments' memory
     * @param leading the type of the argument before the struct
     * @param layout the struct's layout
     * @return the argument list, the leading argument still to be set
     */
    public static KernelArgs ofStruct(Arena arena, Type leading, MemoryLayout layout) {
        if (leading == null) throw new IllegalArgumentException("the leading argument has no type (null)");
        return new KernelArgs(arena, 1, leading, structType(layout)).markStructSet();
    }

    private static Type structType(MemoryLayout layout) {
        if (layout == null) throw new IllegalArgumentException("no struct layout (null)");
        String name = layout.name().orElse("struct");
        return new Type(name + "(" + layout.byteSize() + ")", layout.byteSize(), layout.byteAlignment());
    }

    private KernelArgs markStructSet() {
        unset &= ~(1L << structIndex);
        return this;
    }

    /**
     * The struct's bytes, to be written through the generated accessors. Only for {@link #ofStruct}.
     *
     * @return the struct's slot in the argument block
     * @throws IllegalStateException for a positional list (made by {@link #of})
     */
    public MemorySegment struct() {
        if (structIndex < 0)
            throw new IllegalStateException("struct() is for an argument list made by ofStruct, this one has " + types.length + " positional argument(s)");
        return values.asSlice(offsets[structIndex], types[structIndex].size());
    }

    /**
     * An argument list for a kernel without parameters.
     *
     * @param arena the arena that holds the (empty) list's memory
     * @return the argument list
     */
    public static KernelArgs none(Arena arena) { return new KernelArgs(arena); }

    /**
     * Sets the pointer field at {@code fieldOffset} of the {@link #ofStruct} struct (the generated
     * {@code field$offset()}) to {@code buffer}'s address, or to null for a null buffer, and
     * remembers the buffer for graph captures as {@link #setPointer(int, DeviceBuffer)} does.
     *
     * @param fieldOffset the field's byte offset in the struct, 8-byte aligned
     * @param buffer the buffer whose address the field gets, or null
     * @return this argument list
     */
    public KernelArgs setPointerField(long fieldOffset, DeviceBuffer buffer) {
        MemorySegment st = struct();
        if (fieldOffset < 0 || fieldOffset % 8 != 0 || fieldOffset + 8 > st.byteSize())
            throw new IllegalArgumentException("no pointer field at offset " + fieldOffset + " of " + types[structIndex].name() + " (8-byte aligned, below " + st.byteSize() + ")");
        st.set(ValueLayout.JAVA_LONG, fieldOffset, buffer == null ? 0 : buffer.address());
        fieldBuffers[(int) (fieldOffset / 8)] = buffer;
        return this;
    }

    /** {@return the number of arguments} */
    public int count() { return types.length; }

    /**
     * The type of argument {@code index}.
     *
     * @param index the argument's position
     * @return its type
     */
    public Type type(int index) {
        if (index < 0 || index >= types.length) throw new IndexOutOfBoundsException("argument " + index + " does not exist: this list has " + types.length);
        return types[index];
    }

    /** The slot's offset after checking that it exists and is of {@code expected}'s type (a reference compare for the constants). */
    private long slot(int index, Type expected, String setter) {
        if (index < 0 || index >= types.length) throw new IndexOutOfBoundsException("argument " + index + " does not exist: this list has " + types.length);
        Type t = types[index];
        if (t != expected && !t.equals(expected)) throw wrongType(index, t, setter, expected.name());
        unset &= ~(1L << index);
        return offsets[index];
    }

    private static IllegalArgumentException wrongType(int index, Type t, String setter, String wants) {
        return new IllegalArgumentException("argument " + index + " is " + t.name() + " (" + t.size() + " bytes), but " + setter + " writes " + wants
                + (t.isScalar() ? "" : ": set a struct argument with setStruct"));
    }

    /**
     * Sets an {@link Type#I32} argument.
     *
     * @param index the argument's position
     * @param value the value
     * @return this argument list
     */
    public KernelArgs setInt(int index, int value) { values.set(ValueLayout.JAVA_INT, slot(index, Type.I32, "setInt"), value); return this; }
    /**
     * Sets an {@link Type#I64} argument.
     *
     * @param index the argument's position
     * @param value the value
     * @return this argument list
     */
    public KernelArgs setLong(int index, long value) { values.set(ValueLayout.JAVA_LONG, slot(index, Type.I64, "setLong"), value); return this; }
    /**
     * Sets an {@link Type#F32} argument.
     *
     * @param index the argument's position
     * @param value the value
     * @return this argument list
     */
    public KernelArgs setFloat(int index, float value) { values.set(ValueLayout.JAVA_FLOAT, slot(index, Type.F32, "setFloat"), value); return this; }
    /**
     * Sets an {@link Type#F64} argument.
     *
     * @param index the argument's position
     * @param value the value
     * @return this argument list
     */
    public KernelArgs setDouble(int index, double value) { values.set(ValueLayout.JAVA_DOUBLE, slot(index, Type.F64, "setDouble"), value); return this; }

    /**
     * Sets a {@link Type#POINTER} argument to a raw device address (0 for a null pointer). A graph
     * captured from a launch does not know what memory a raw address belongs to: prefer the
     * {@link DeviceBuffer} form, or {@link Stream#noteUse(DeviceBuffer)} the buffer.
     *
     * @param index the argument's position
     * @param deviceAddress the device address, or 0
     * @return this argument list
     */
    public KernelArgs setPointer(int index, long deviceAddress) {
        values.set(ValueLayout.JAVA_LONG, slot(index, Type.POINTER, "setPointer"), deviceAddress);
        buffers[index] = null;
        return this;
    }

    /**
     * Sets a {@link Type#POINTER} argument to {@code buffer}'s address.
     *
     * @param index the argument's position
     * @param buffer the buffer, remembered for graph captures
     * @return this argument list
     */
    public KernelArgs setPointer(int index, DeviceBuffer buffer) {
        setPointer(index, buffer.address());
        buffers[index] = buffer;
        return this;
    }

    void noteBuffers(CapturedUses uses) {
        for (DeviceBuffer b : buffers) if (b != null) uses.add(b.segment(), b);
        for (DeviceBuffer b : fieldBuffers) if (b != null) uses.add(b.segment(), b);
    }

    /**
     * Copies a by-value struct's bytes (exactly the declared size) into its slot, which must be a struct type (not one of the scalar constants).
     *
     * @param index the argument's position
     * @param bytes the struct's bytes
     * @return this argument list
     */
    public KernelArgs setStruct(int index, MemorySegment bytes) {
        if (index < 0 || index >= types.length) throw new IndexOutOfBoundsException("argument " + index + " does not exist: this list has " + types.length);
        Type t = types[index];
        if (t.isScalar()) throw wrongType(index, t, "setStruct", "a struct");
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
