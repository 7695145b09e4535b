package dev.gin4j.comm;

/** A collective-library call (NCCL or RCCL) failed, or a collective setup step did not agree across ranks. */
public class CommException extends RuntimeException {
    private final String call;
    private final int code;

    public CommException(String call, int code, String errorName, String detail) {
        super(call + " failed: " + errorName + " (" + code + "): " + detail);
        this.call = call;
        this.code = code;
    }

    /** {@code failure}'s call and code, with more said about it. */
    public CommException(String message, CommException failure) {
        super(message, failure);
        this.call = failure.call;
        this.code = failure.code;
    }

    public CommException(String message) {
        super(message);
        this.call = "";
        this.code = 0;
    }

    public CommException(String message, Throwable cause) {
        super(message, cause);
        this.call = "";
        this.code = 0;
    }

    public String call() { return call; }
    public int code() { return code; }
}
