package featurestore.ycsb;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.Vector;

import dev.featurestore.client.FeatureClient;
import dev.featurestore.client.FeatureClient.FeatureStoreException;
import dev.featurestore.client.FeatureClient.Lookup;
import dev.featurestore.client.FeatureClient.Result;
import dev.featurestore.client.FeatureClient.Row;
import dev.featurestore.client.FeatureClient.WriteRow;
import dev.featurestore.client.FeatureClient.WriteStats;

import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;
import site.ycsb.StringByteIterator;

/**
 * The project's gRPC API over loopback, through its Java client ({@code clients/java}): a
 * batch read is one {@code GetFeatures} call of K ids x F features, a write one
 * {@code WriteFeatures} call of one entity. The same records, entity type and group as
 * {@link ServingClient}, so the REST and gRPC rows read the same data.
 *
 * <p>A read is OK only when every value comes back with status {@code present}. Each YCSB
 * thread has its own client, so its own HTTP/2 connection.
 *
 * <p>Properties: serving.grpc (host:port, default 127.0.0.1:50051), serving.timeout (ms),
 * serving.apikey, serving.bypasscache (default false), fs.entity, fs.group.
 */
public class GrpcServingClient extends DB implements BatchReader {
  private FeatureClient client;
  private boolean bypassCache;
  private Layout layout;

  @Override
  public void init() throws DBException {
    layout = new Layout(getProperties());
    String target = getProperties().getProperty("serving.grpc", "127.0.0.1:50051");
    FeatureClient.Options options = new FeatureClient.Options()
        .timeout(Duration.ofMillis(Long.parseLong(
            getProperties().getProperty("serving.timeout", "5000"))))
        .retries(0);  // a failed call is counted, not hidden by a retry
    String apiKey = getProperties().getProperty("serving.apikey");
    if (apiKey != null) {
      options.apiKey(apiKey);
    }
    bypassCache = Boolean.parseBoolean(getProperties().getProperty("serving.bypasscache", "false"));
    try {
      client = FeatureClient.connect(target, options);
    } catch (IOException e) {
      throw new DBException("cannot connect to " + target, e);
    }
  }

  @Override
  public void cleanup() {
    if (client != null) {
      client.close();
    }
  }

  @Override
  public Status read(String table, String key, Set<String> fields,
                     Map<String, ByteIterator> result) {
    List<Map<String, ByteIterator>> rows = new ArrayList<>(1);
    Status status = batchRead(table, List.of(key),
        fields == null ? List.of() : new ArrayList<>(fields), rows);
    if (!rows.isEmpty()) {
      result.putAll(rows.get(0));
    }
    return status;
  }

  @Override
  public Status batchRead(String table, List<String> keys, List<String> fields,
                          List<Map<String, ByteIterator>> result) {
    Lookup lookup = new Lookup(layout.entity, List.of(), keys,
        fields, fields.isEmpty() ? List.of(layout.group) : List.of(), bypassCache);
    Result answer;
    try {
      answer = client.get(lookup);
    } catch (FeatureStoreException e) {
      Errors.report("serving-grpc", "read", e);
      return Status.ERROR;
    }
    List<String> names = answer.features();
    if (answer.rows().size() != keys.size()) {
      Errors.report("serving-grpc", "asked " + keys.size() + " ids, got "
          + answer.rows().size() + " rows");
      return Status.UNEXPECTED_STATE;
    }
    Status status = Status.OK;
    for (Row r : answer.rows()) {
      Map<String, ByteIterator> row = new HashMap<>(names.size() * 2);
      for (int i = 0; i < names.size(); i++) {
        String valueStatus = r.statuses().get(i);
        if (!"present".equals(valueStatus)) {
          if (status.isOk()) {
            Errors.report("serving-grpc", "entity " + r.id() + " feature " + names.get(i)
                + " is " + valueStatus + " (ages " + r.ages() + ")");
          }
          status = Status.NOT_FOUND;
        } else {
          row.put(names.get(i), new StringByteIterator(String.valueOf(r.values().get(i))));
        }
      }
      result.add(row);
    }
    return status;
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
                     Vector<HashMap<String, ByteIterator>> result) {
    return Status.NOT_IMPLEMENTED;
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    return insert(table, key, values);
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    Map<String, Object> row = new HashMap<>(values.size() * 2);
    values.forEach((name, value) -> row.put(name, value.toString()));
    try {
      WriteStats stats = client.write(layout.group, List.of(new WriteRow(key, row, null)));
      return Writes.outcome("serving-grpc", stats.valuesWritten(), stats.skipped(), values.size());
    } catch (FeatureStoreException e) {
      Errors.report("serving-grpc", "write", e);
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    return Status.NOT_IMPLEMENTED;
  }
}
