package featurestore.ycsb;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.Vector;

import redis.clients.jedis.Response;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.exceptions.JedisException;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * The flat layout the hash layout replaces: one Redis string per (entity, feature), keyed
 * {@code "{prefix}:{id}:" + xxh32(feature)} so that it differs from the hash layout in layout
 * only, not in key or field bytes. Every value gets its own TTL (SET ... EX). There is no
 * freshness value: the flat layout has nowhere cheap to keep one.
 *
 * <p>A batch read of K keys x F fields is one MGET of K*F keys ({@code flat.batch=mget}, the
 * default on a standalone server) or one pipeline of K*F GETs ({@code flat.batch=pipeline}, and
 * always on a Redis Cluster, where one MGET cannot span slots: one pipeline per node,
 * {@link Batch}).
 *
 * <p>Properties: redis.host, redis.port, redis.cluster, redis.timeout (ms), fs.prefix,
 * fs.ttl (s), flat.batch.
 */
public class FlatClient extends DB implements BatchReader {
  private UnifiedJedis redis;
  private Layout layout;
  private boolean mget;

  @Override
  public void init() throws DBException {
    layout = new Layout(getProperties());
    String mode = getProperties().getProperty("flat.batch", "mget");
    if (!mode.equals("mget") && !mode.equals("pipeline")) {
      throw new DBException("flat.batch must be mget or pipeline, got " + mode);
    }
    try {
      redis = RedisClients.acquire(getProperties());
    } catch (JedisException e) {
      throw new DBException("cannot connect to Redis: " + e.getMessage(), e);
    }
    mget = mode.equals("mget") && !RedisClients.isCluster();
  }

  @Override
  public void cleanup() throws DBException {
    RedisClients.release();
  }

  @Override
  public Status read(String table, String key, Set<String> fields,
                     Map<String, ByteIterator> result) {
    // all fields: the record's, as the core workload names them (the flat layout does not list an entity's features)
    List<String> names = fields == null ? layout.allFields : new ArrayList<>(fields);
    List<Map<String, ByteIterator>> rows = new ArrayList<>(1);
    Status status = batchRead(table, List.of(key), names, rows);
    if (!rows.isEmpty()) {
      result.putAll(rows.get(0));
    }
    return status;
  }

  @Override
  public Status batchRead(String table, List<String> keys, List<String> fields,
                          List<Map<String, ByteIterator>> result) {
    int nf = fields.size();
    byte[][] flatKeys = new byte[keys.size() * nf][];
    for (int k = 0; k < keys.size(); k++) {
      for (int f = 0; f < nf; f++) {
        flatKeys[k * nf + f] = layout.flatKey(keys.get(k), fields.get(f));
      }
    }
    try {
      List<byte[]> values;
      if (mget) {
        values = redis.mget(flatKeys);
      } else {
        List<Response<byte[]>> replies = new ArrayList<>(flatKeys.length);
        try (Batch batch = RedisClients.batch(redis)) {
          for (byte[] k : flatKeys) {
            replies.add(batch.on(k).get(k));
          }
          batch.sync();
        }
        values = new ArrayList<>(flatKeys.length);
        for (Response<byte[]> r : replies) {
          values.add(r.get());
        }
      }
      Status status = Status.OK;
      for (int k = 0; k < keys.size(); k++) {
        Map<String, ByteIterator> row = new HashMap<>(nf * 2);
        for (int f = 0; f < nf; f++) {
          byte[] v = values.get(k * nf + f);
          if (v == null) {
            status = Status.NOT_FOUND;
          } else {
            row.put(fields.get(f), new ByteArrayByteIterator(v));
          }
        }
        result.add(row);
      }
      return status;
    } catch (JedisException e) {
      Errors.report("flat", "redis", e);
      return Status.ERROR;
    }
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
    List<Response<String>> replies = new ArrayList<>(values.size());
    try (Batch batch = RedisClients.batch(redis)) {
      for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
        byte[] flatKey = layout.flatKey(key, e.getKey());
        replies.add(batch.on(flatKey).setex(flatKey, layout.ttlSeconds, e.getValue().toArray()));
      }
      batch.sync();
      for (Response<String> r : replies) {
        if (!"OK".equals(r.get())) {
          return Status.ERROR;
        }
      }
      return Status.OK;
    } catch (JedisException e) {
      Errors.report("flat", "redis", e);
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    return Status.NOT_IMPLEMENTED;  // would need the field list; no workload deletes
  }
}
