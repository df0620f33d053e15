package featurestore.ycsb;

import java.io.FileNotFoundException;

import org.HdrHistogram.EncodableHistogram;
import org.HdrHistogram.Histogram;
import org.HdrHistogram.HistogramLogReader;

/**
 * The tail of a YCSB run's latencies, from the HdrHistogram logs it writes
 * ({@code hdrhistogram.fileoutput=true}, one per operation): {@code java
 * featurestore.ycsb.LatencyTail BOUND_US NAME=FILE.hdr ...} prints, in YCSB's own output format,
 * {@code [NAME], Bound(us), BOUND_US} and {@code [NAME], PastBound(ops), N}: the operations
 * slower than the bound. YCSB prints percentiles and the maximum but no count past a bound; the
 * histogram it logs holds every operation's latency (to 3 significant digits).
 */
public final class LatencyTail {
  private LatencyTail() {
  }

  public static void main(String[] args) throws FileNotFoundException {
    if (args.length < 2) {
      System.err.println("usage: LatencyTail BOUND_US NAME=FILE.hdr ...");
      System.exit(2);
    }
    long bound = Long.parseLong(args[0]);
    for (int i = 1; i < args.length; i++) {
      int eq = args[i].indexOf('=');
      String name = args[i].substring(0, eq);
      Histogram all = read(args[i].substring(eq + 1));
      long past = 0;
      if (all != null && all.getMaxValue() > bound) {
        // the values above the bound's bucket
        past = all.getCountBetweenValues(all.highestEquivalentValue(bound) + 1, all.getMaxValue());
      }
      System.out.println("[" + name + "], Bound(us), " + bound);
      System.out.println("[" + name + "], PastBound(ops), " + past);
    }
  }

  /** Every interval of one log, added up; null if it holds none. */
  private static Histogram read(String file) throws FileNotFoundException {
    Histogram all = null;
    HistogramLogReader reader = new HistogramLogReader(file);
    EncodableHistogram h;
    while ((h = reader.nextIntervalHistogram()) != null) {
      Histogram interval = (Histogram) h;
      if (all == null) {
        all = new Histogram(interval.getNumberOfSignificantValueDigits());
      }
      all.add(interval);
    }
    return all;
  }
}
