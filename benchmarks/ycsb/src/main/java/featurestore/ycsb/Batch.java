package featurestore.ycsb;

import java.util.LinkedHashMap;
import java.util.Map;

import redis.clients.jedis.AbstractPipeline;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.providers.ClusterConnectionProvider;
import redis.clients.jedis.util.JedisClusterCRC16;

/**
 * Pipelined commands of one operation, sent in one round trip per Redis node: on a standalone
 * server Jedis's own pipeline; on a Redis Cluster one pipeline per master that owns a key of
 * the batch, on a pooled connection, synced in turn on the calling thread.
 *
 * <p>Not Jedis's {@code ClusterPipeline}: in Jedis 5.1 its {@code sync()} starts a pool of three
 * threads and shuts it down again on every call, which costs the client more than the reads
 * (see docs/ycsb.md). A key whose slot moved mid-run fails its reply (MOVED), counted as an
 * error: the benchmark's cluster does not reshard.
 */
final class Batch implements AutoCloseable {
  private final AbstractPipeline single;
  private final ClusterConnectionProvider cluster;
  private final Map<HostAndPort, Pipeline> byNode;

  Batch(AbstractPipeline single) {
    this.single = single;
    this.cluster = null;
    this.byNode = null;
  }

  Batch(ClusterConnectionProvider cluster) {
    this.single = null;
    this.cluster = cluster;
    this.byNode = new LinkedHashMap<>(4);
  }

  /** The pipeline that reaches {@code key}'s node. */
  AbstractPipeline on(byte[] key) {
    if (single != null) {
      return single;
    }
    HostAndPort node = cluster.getNode(JedisClusterCRC16.getSlot(key));
    Pipeline p = byNode.get(node);
    if (p == null) {
      p = new Pipeline(cluster.getConnection(node), true);  // closing returns the connection
      byNode.put(node, p);
    }
    return p;
  }

  void sync() {
    if (single != null) {
      single.sync();
      return;
    }
    for (Pipeline p : byNode.values()) {
      p.sync();
    }
  }

  @Override
  public void close() {
    if (single != null) {
      single.close();
      return;
    }
    for (Pipeline p : byNode.values()) {
      p.close();
    }
    byNode.clear();
  }
}
