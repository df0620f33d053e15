package featurestore.ycsb;

import java.util.concurrent.atomic.AtomicLong;

import site.ycsb.Status;

/**
 * The outcome of a serving binding's write of one record. The serving API orders writes by
 * event time: a write that reaches Redis after a newer write of the same record is skipped
 * (the answer's {@code skipped}), because the newest event wins. Under YCSB's zipfian updates
 * at many threads two writes of a hot record can arrive in the opposite order of their
 * stamps, so a skipped write is the store keeping its promise, not a failure: it is OK, and
 * counted on stderr when the JVM exits. Anything else short of every value written is an
 * error, reported with what the server answered.
 */
final class Writes {
  private static final AtomicLong SUPERSEDED = new AtomicLong();

  static {
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      long n = SUPERSEDED.get();
      if (n > 0) {
        System.err.println("[writes] " + n + " writes skipped by the server: a newer write of"
            + " the same record was already stored (event time), so they were superseded");
      }
    }));
  }

  private Writes() {
  }

  static Status outcome(String binding, long written, long skipped, int expected) {
    if (written == expected) {
      return Status.OK;
    }
    if (written == 0 && skipped == 1) {
      SUPERSEDED.incrementAndGet();
      return Status.OK;
    }
    Errors.report(binding, "write of " + expected + " values: " + written + " written, "
        + skipped + " skipped");
    return Status.ERROR;
  }
}
