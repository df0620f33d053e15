package featurestore.ycsb;

import java.time.Duration;
import java.util.HashSet;
import java.util.Properties;
import java.util.Set;

import org.apache.commons.pool2.impl.GenericObjectPoolConfig;

import redis.clients.jedis.Connection;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisCluster;
import redis.clients.jedis.JedisPooled;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.providers.ClusterConnectionProvider;

/**
 * One Redis client shared by the YCSB threads of a process, with a connection pool as large as
 * the thread count: a standalone server, or a Redis Cluster when {@code redis.cluster=true}.
 */
final class RedisClients {
  private static UnifiedJedis client;
  private static ClusterConnectionProvider cluster;  // null: a standalone server
  private static int users;

  private RedisClients() {
  }

  static synchronized UnifiedJedis acquire(Properties p) {
    if (client == null) {
      String host = p.getProperty("redis.host", "127.0.0.1");
      int port = Integer.parseInt(p.getProperty("redis.port", "6379"));
      int timeoutMs = Integer.parseInt(p.getProperty("redis.timeout", "2000"));
      int threads = Integer.parseInt(p.getProperty("threadcount", "1"));
      GenericObjectPoolConfig<Connection> pool = new GenericObjectPoolConfig<>();
      pool.setMaxTotal(Math.max(8, threads * 2));
      pool.setMaxIdle(Math.max(8, threads * 2));
      if (Boolean.parseBoolean(p.getProperty("redis.cluster", "false"))) {
        Set<HostAndPort> nodes = new HashSet<>();
        nodes.add(new HostAndPort(host, port));
        DefaultJedisClientConfig config = DefaultJedisClientConfig.builder()
            .connectionTimeoutMillis(timeoutMs).socketTimeoutMillis(timeoutMs).build();
        cluster = new ClusterConnectionProvider(nodes, config, pool);
        client = new JedisCluster(cluster, 3, Duration.ofMillis(3L * timeoutMs));
      } else {
        client = new JedisPooled(pool, host, port, timeoutMs);
      }
    }
    users++;
    return client;
  }

  static synchronized boolean isCluster() {
    return cluster != null;
  }

  /** A batch of pipelined commands on {@code redis} (the client this class handed out). */
  static Batch batch(UnifiedJedis redis) {
    ClusterConnectionProvider nodes;
    synchronized (RedisClients.class) {
      nodes = cluster;
    }
    return nodes == null ? new Batch(redis.pipelined()) : new Batch(nodes);
  }

  static synchronized void release() {
    users--;
    if (users == 0 && client != null) {
      client.close();  // and the cluster's provider with it
      client = null;
      cluster = null;
    }
  }
}
