package featurestore.ycsb;

import java.util.List;
import java.util.Map;

import site.ycsb.ByteIterator;
import site.ycsb.Status;

/**
 * A binding that can read many records in one operation. YCSB 0.17.0's {@code DB} has no batch
 * read, so {@link BatchReadWorkload} calls this on the binding behind YCSB's measuring wrapper.
 */
public interface BatchReader {
  /**
   * Reads {@code fields} of every key in {@code keys} (keys may repeat, as a skewed request
   * distribution draws them) and appends one map per key, in order, to {@code result}.
   *
   * @return {@code OK} only when every requested value was found; {@code NOT_FOUND} when any
   *     value is missing, so a binding that silently reads nothing cannot look fast.
   */
  Status batchRead(String table, List<String> keys, List<String> fields,
                   List<Map<String, ByteIterator>> result);
}
