package dev.gin4j.gpu;

import dev.gin4j.gpu.driver.Driver;

import java.lang.foreign.MemorySegment;
import java.lang.reflect.Constructor;
import java.lang.reflect.Proxy;
import java.util.List;

/**
 * Devices of a runtime with no GPU behind it, for tests of checks that must come before any
 * device work: the runtime answers its name and device count, and every other driver call fails
 * the test, naming the call. Buffers made here ({@link #buffer}) wrap made-up addresses that
 * nothing may touch.
 */
public final class NoGpuDevices {
    private NoGpuDevices() {}

    /** {@return {@code n} devices of one runtime whose driver refuses every call but its name and device count} */
    public static List<Device> devices(int n) {
        Driver driver = (Driver) Proxy.newProxyInstance(Driver.class.getClassLoader(), new Class<?>[] {Driver.class}, (proxy, m, args) -> switch (m.getName()) {
            case "name" -> "no-GPU test runtime";
            case "deviceCount" -> n;
            case "toString" -> "no-GPU test driver";
            case "hashCode" -> System.identityHashCode(proxy);
            case "equals" -> proxy == args[0];
            default -> throw new AssertionError("no GPU here: the code under test called Driver." + m.getName() + " (device work before its checks were done)");
        });
        try {
            Constructor<GpuRuntime> make = GpuRuntime.class.getDeclaredConstructor(Driver.class);
            make.setAccessible(true);
            return make.newInstance(driver).devices();
        } catch (ReflectiveOperationException e) {
            throw new AssertionError("cannot make the no-GPU test runtime", e);
        }
    }

    /**
     * {@return a buffer of {@code bytes} at the made-up device address {@code address} of {@code device}, never touched}
     * @param device its device
     * @param address a made-up address, not 0
     * @param bytes its size
     */
    public static DeviceBuffer buffer(Device device, long address, long bytes) {
        return DeviceBuffer.wrap(device, MemorySegment.ofAddress(address).reinterpret(bytes));
    }
}
