package dev.gin4j.gpu;

/**
 * A GPU runtime call failed. Carries the call, the runtime's status code, the runtime's own
 * name for that code (for example {@code CUDA_ERROR_INVALID_VALUE} or {@code hipErrorNoDevice})
 * and its message.
 */
public class GpuException extends RuntimeException {
    private final String call;
    private final int code;
    private final String errorName;

    /**
     * A failed runtime call: its name, the runtime's status code, and the runtime's name and text for it.
     *
     * @param call the runtime call that failed
     * @param code the runtime's status code
     * @param errorName the runtime's name for the code
     * @param errorMessage the runtime's text for the code
     */
    public GpuException(String call, int code, String errorName, String errorMessage) {
        super(call + " failed: " + errorName + " (" + code + "): " + errorMessage);
        this.call = call;
        this.code = code;
        this.errorName = errorName;
    }

    /**
     * For failures detected by gin4j itself before or after a call (no runtime status code).
     *
     * @param message what went wrong
     */
    public GpuException(String message) {
        super(message);
        this.call = "";
        this.code = 0;
        this.errorName = "";
    }

    /**
     * {@code cause} with what gin4j was doing put in front of its message ("kernel x launched
     * with ..."); keeps the cause's call, status code and error name.
     *
     * @param context what gin4j was doing
     * @param cause the failure it ran into
     */
    public GpuException(String context, GpuException cause) {
        super(context + ": " + cause.getMessage(), cause);
        this.call = cause.call;
        this.code = cause.code;
        this.errorName = cause.errorName;
    }

    /** {@return the runtime call that failed ("cuLaunchKernel", ...), or empty for a failure gin4j found itself} */
    public String call() { return call; }
    /** {@return the runtime's status code, or 0} */
    public int code() { return code; }
    /** {@return the runtime's name of the status ("CUDA_ERROR_ILLEGAL_ADDRESS", ...), or empty} */
    public String errorName() { return errorName; }
}
