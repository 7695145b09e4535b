package dev.gin4j.comm;

/** A collective-library call (NCCL or RCCL) failed, or a collective setup step did not agree across ranks. */
public class CommException extends RuntimeException {
    private final String call;
    private final int code;

    /**
     * A failed library call: its name, the status code, the library's name for it and what it said.
     *
     * @param call the library call that failed
     * @param code the library's status code
     * @param errorName the library's name for the code
     * @param detail what the library said
     */
    public CommException(String call, int code, String errorName, String detail) {
        super(call + " failed: " + errorName + " (" + code + "): " + detail);
        this.call = call;
        this.code = code;
    }

    /**
     * {@code failure}'s call and code, with more said about it.
     *
     * @param message what gin4j was doing, said before {@code failure}'s message
     * @param failure the library call's failure, kept as the cause
     */
    public CommException(String message, CommException failure) {
        super(message, failure);
        this.call = failure.call;
        this.code = failure.code;
    }

    /**
     * A failure gin4j found itself.
     *
     * @param message what went wrong
     */
    public CommException(String message) {
        super(message);
        this.call = "";
        this.code = 0;
    }

    /**
     * A failure gin4j found itself, caused by {@code cause}.
     *
     * @param message what went wrong
     * @param cause what caused it
     */
    public CommException(String message, Throwable cause) {
        super(message, cause);
        this.call = "";
        this.code = 0;
    }

    /** {@return the library call that failed, or empty} */
    public String call() { return call; }
    /** {@return the library's status code, or 0} */
    public int code() { return code; }
}
