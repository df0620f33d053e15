package featurestore.ycsb;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.Vector;

import redis.clients.jedis.AbstractPipeline;
import redis.clients.jedis.Response;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.exceptions.JedisException;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * The project's layout: one Redis hash per entity, 4-byte xxh32 fields, a freshness field and
 * EXPIRE on every write, exactly as {@code feature_store.batch.plan_write} writes it. A batch
 * read is one pipeline of HMGET (one per key, the requested fields then the freshness field),
 * which is what {@code plan_read} sends. Works on a standalone server or a Redis Cluster
 * ({@code redis.cluster=true}: one pipeline per node, {@link Batch}).
 *
 * <p>Properties: redis.host, redis.port, redis.cluster, redis.timeout (ms), fs.prefix,
 * fs.group, fs.ttl (s).
 */
public class HashClient extends DB implements BatchReader {
  private UnifiedJedis redis;
  private Layout layout;
  private final Map<String, byte[]> fieldCache = new HashMap<>();

  @Override
  public void init() throws DBException {
    layout = new Layout(getProperties());
    try {
      redis = RedisClients.acquire(getProperties());
    } catch (JedisException e) {
      throw new DBException("cannot connect to Redis: " + e.getMessage(), e);
    }
  }

  @Override
  public void cleanup() throws DBException {
    RedisClients.release();
  }

  private byte[] field(String name) {
    return fieldCache.computeIfAbsent(name, Layout::field);
  }

  private byte[][] fieldArgs(List<String> fields) {
    byte[][] args = new byte[fields.size() + 1][];
    for (int i = 0; i < fields.size(); i++) {
      args[i] = field(fields.get(i));
    }
    args[fields.size()] = layout.freshnessField;
    return args;
  }

  @Override
  public Status read(String table, String key, Set<String> fields,
                     Map<String, ByteIterator> result) {
    if (fields == null) {
      return readAll(key, result);
    }
    List<Map<String, ByteIterator>> rows = new ArrayList<>(1);
    Status status = batchRead(table, List.of(key), new ArrayList<>(fields), rows);
    if (!rows.isEmpty()) {
      result.putAll(rows.get(0));
    }
    return status;
  }

  private Status readAll(String key, Map<String, ByteIterator> result) {
    // Field names are one-way hashes, so "all fields" can only come back keyed by hash.
    try {
      Map<byte[], byte[]> all = redis.hgetAll(layout.entityKey(key));
      if (all.isEmpty()) {
        return Status.NOT_FOUND;
      }
      for (Map.Entry<byte[], byte[]> e : all.entrySet()) {
        result.put(java.util.HexFormat.of().formatHex(e.getKey()),
            new ByteArrayByteIterator(e.getValue()));
      }
      return Status.OK;
    } catch (JedisException e) {
      Errors.report("hash", "redis", e);
      return Status.ERROR;
    }
  }

  @Override
  public Status batchRead(String table, List<String> keys, List<String> fields,
                          List<Map<String, ByteIterator>> result) {
    byte[][] args = fieldArgs(fields);
    List<Response<List<byte[]>>> replies = new ArrayList<>(keys.size());
    try (Batch batch = RedisClients.batch(redis)) {
      for (String key : keys) {
        byte[] entityKey = layout.entityKey(key);
        replies.add(batch.on(entityKey).hmget(entityKey, args));
      }
      batch.sync();
      Status status = Status.OK;
      for (Response<List<byte[]>> reply : replies) {
        List<byte[]> values = reply.get();
        Map<String, ByteIterator> row = new HashMap<>(fields.size() * 2);
        for (int i = 0; i < fields.size(); i++) {
          byte[] v = values.get(i);
          if (v == null) {
            status = Status.NOT_FOUND;
          } else {
            row.put(fields.get(i), new ByteArrayByteIterator(v));
          }
        }
        if (values.get(fields.size()) == null) {
          status = Status.NOT_FOUND;  // every write sets the freshness field
        }
        result.add(row);
      }
      return status;
    } catch (JedisException e) {
      Errors.report("hash", "redis", e);
      return Status.ERROR;
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
                     Vector<HashMap<String, ByteIterator>> result) {
    return Status.NOT_IMPLEMENTED;  // entity hashes have no key order to scan
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    return write(key, values);
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    return write(key, values);
  }

  /** HSET of the values and the freshness timestamp in one command, then EXPIRE. */
  private Status write(String key, Map<String, ByteIterator> values) {
    byte[] entityKey = layout.entityKey(key);
    Map<byte[], byte[]> hash = new LinkedHashMap<>(values.size() * 2 + 2);
    for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
      hash.put(field(e.getKey()), e.getValue().toArray());
    }
    hash.put(layout.freshnessField, Layout.timestamp());
    try (Batch batch = RedisClients.batch(redis)) {
      AbstractPipeline p = batch.on(entityKey);
      Response<Long> hset = p.hset(entityKey, hash);
      Response<Long> expire = p.expire(entityKey, layout.ttlSeconds);
      batch.sync();
      hset.get();
      return expire.get() == 1L ? Status.OK : Status.ERROR;
    } catch (JedisException e) {
      Errors.report("hash", "redis", e);
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      return redis.del(layout.entityKey(key)) == 1L ? Status.OK : Status.NOT_FOUND;
    } catch (JedisException e) {
      Errors.report("hash", "redis", e);
      return Status.ERROR;
    }
  }
}
