package featurestore.ycsb;

import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ThreadLocalRandom;

import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBWrapper;
import site.ycsb.Status;
import site.ycsb.WorkloadException;
import site.ycsb.generator.ExponentialGenerator;
import site.ycsb.measurements.Measurements;
import site.ycsb.workloads.CoreWorkload;

/**
 * {@link CoreWorkload} where every READ is a batch read of {@code batchkeys} keys x
 * {@code batchfields} fields (default 100 x 10), measured as its own operation, BATCH_READ.
 * The keys are drawn one by one from CoreWorkload's request distribution, so a zipfian batch
 * holds hot keys (and repeats) as production batches do. Updates, inserts and the load phase
 * are CoreWorkload's, so {@code readproportion=0.95, updateproportion=0.05} is the 95/5 mix.
 *
 * <p>The binding must implement {@link BatchReader}.
 */
public class BatchReadWorkload extends CoreWorkload {
  public static final String BATCH_KEYS_PROPERTY = "batchkeys";
  public static final String BATCH_FIELDS_PROPERTY = "batchfields";
  public static final String MEASUREMENT = "BATCH_READ";

  /** YCSB hands workloads its measuring wrapper; the batch call goes to the binding inside. */
  private static final Field WRAPPED_DB;

  static {
    try {
      WRAPPED_DB = DBWrapper.class.getDeclaredField("db");
      WRAPPED_DB.setAccessible(true);
    } catch (NoSuchFieldException e) {
      throw new ExceptionInInitializerError(e);
    }
  }

  private final Measurements measurements = Measurements.getMeasurements();
  private List<String> allFields;
  private int batchKeys;
  private int batchFields;

  @Override
  public void init(Properties p) throws WorkloadException {
    super.init(p);
    String prefix = p.getProperty(FIELD_NAME_PREFIX, FIELD_NAME_PREFIX_DEFAULT);
    allFields = new ArrayList<>();
    for (int i = 0; i < fieldcount; i++) {
      allFields.add(prefix + i);
    }
    allFields = Collections.unmodifiableList(allFields);
    batchKeys = Integer.parseInt(p.getProperty(BATCH_KEYS_PROPERTY, "100"));
    batchFields = Integer.parseInt(p.getProperty(BATCH_FIELDS_PROPERTY, Long.toString(fieldcount)));
    if (batchKeys < 1 || batchFields < 1 || batchFields > fieldcount) {
      throw new WorkloadException("need batchkeys >= 1 and 1 <= batchfields <= fieldcount ("
          + fieldcount + "), got " + batchKeys + " x " + batchFields);
    }
  }

  @Override
  public boolean doTransaction(DB db, Object threadstate) {
    String operation = operationchooser.nextString();
    if (operation == null) {
      return false;
    }
    switch (operation) {
      case "READ":
        return doBatchRead(db);
      case "UPDATE":
        doTransactionUpdate(db);
        return true;
      case "INSERT":
        doTransactionInsert(db);
        return true;
      case "SCAN":
        doTransactionScan(db);
        return true;
      default:
        doTransactionReadModifyWrite(db);
        return true;
    }
  }

  private static BatchReader batchReader(DB db) {
    DB inner = db;
    if (db instanceof DBWrapper) {
      try {
        inner = (DB) WRAPPED_DB.get(db);
      } catch (IllegalAccessException e) {
        throw new IllegalStateException(e);
      }
    }
    return inner instanceof BatchReader ? (BatchReader) inner : null;
  }

  private boolean doBatchRead(DB db) {
    BatchReader reader = batchReader(db);
    if (reader == null) {
      // Stops this thread; the runner then sees fewer operations than asked and fails.
      System.err.println("the binding does not implement " + BatchReader.class.getName());
      return false;
    }
    List<String> keys = new ArrayList<>(batchKeys);
    for (int i = 0; i < batchKeys; i++) {
      keys.add(buildKeyName(nextKey()));
    }
    List<String> fields = allFields;
    if (batchFields < allFields.size()) {
      List<String> shuffled = new ArrayList<>(allFields);
      Collections.shuffle(shuffled, ThreadLocalRandom.current());
      fields = shuffled.subList(0, batchFields);
    }
    List<Map<String, ByteIterator>> rows = new ArrayList<>(batchKeys);
    long intended = measurements.getIntendedtartTimeNs();
    long start = System.nanoTime();
    Status status = reader.batchRead(table, keys, fields, rows);
    long end = System.nanoTime();
    String name = status.isOk() ? MEASUREMENT : MEASUREMENT + "-FAILED";
    measurements.measure(name, (int) ((end - start) / 1000));
    measurements.measureIntended(name, (int) ((end - intended) / 1000));
    measurements.reportStatus(MEASUREMENT, status);
    return true;
  }

  /** CoreWorkload.nextKeynum(), which is package-private: the same request distribution. */
  private long nextKey() {
    long keynum;
    if (keychooser instanceof ExponentialGenerator) {
      do {
        keynum = transactioninsertkeysequence.lastValue() - keychooser.nextValue().intValue();
      } while (keynum < 0);
    } else {
      do {
        keynum = keychooser.nextValue().intValue();
      } while (keynum > transactioninsertkeysequence.lastValue());
    }
    return keynum;
  }
}
