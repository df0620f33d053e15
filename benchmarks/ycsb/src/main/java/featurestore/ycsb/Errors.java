package featurestore.ycsb;

import java.util.concurrent.atomic.AtomicInteger;

/**
 * Prints the first few errors of a run to stderr. A failed operation is already counted in
 * YCSB's {@code Return=} lines; this says why, without flooding the log.
 */
final class Errors {
  private static final int LIMIT = 5;
  private static final AtomicInteger PRINTED = new AtomicInteger();

  private Errors() {
  }

  static void report(String binding, String what, Exception e) {
    report(binding, what + ": " + e);
  }

  static void report(String binding, String message) {
    if (PRINTED.incrementAndGet() <= LIMIT) {
      System.err.println("[" + binding + "] " + message);
    }
  }
}
