package featurestore.ycsb;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.nio.charset.StandardCharsets;
import java.util.Properties;

import net.jpountz.xxhash.XXHash32;
import net.jpountz.xxhash.XXHashFactory;

/**
 * The project's on-Redis layout (feature_store/layout.py), restated for the Java bindings.
 *
 * <pre>
 *   key        "{prefix}:{entity_id}"                 one HASH per entity
 *   field      xxh32(feature_name, seed 0), 4 bytes big-endian
 *   freshness  field xxh32("__written_at__:{group}") = unix seconds of the last write
 *   expiry     EXPIRE key ttl on every write
 * </pre>
 *
 * YCSB's records are entities of a string-id entity type, its fields are string features, and
 * a string feature's value is its UTF-8 bytes, which is what YCSB generates.
 */
final class Layout {
  static final String PREFIX_PROPERTY = "fs.prefix";
  static final String GROUP_PROPERTY = "fs.group";
  static final String TTL_PROPERTY = "fs.ttl";
  static final String ENTITY_PROPERTY = "fs.entity";

  private static final XXHash32 XXH32 = XXHashFactory.fastestJavaInstance().hash32();
  private static final int FIELD_SEED = 0;

  final String prefix;
  final String group;
  final String entity;
  final long ttlSeconds;
  final byte[] freshnessField;
  /** A record's field names, as YCSB's core workload names them ("read all fields"). */
  final List<String> allFields;

  Layout(Properties p) {
    prefix = p.getProperty(PREFIX_PROPERTY, "u");
    group = p.getProperty(GROUP_PROPERTY, "ycsb");
    entity = p.getProperty(ENTITY_PROPERTY, "ycsb_user");
    ttlSeconds = Long.parseLong(p.getProperty(TTL_PROPERTY, "604800"));
    freshnessField = field("__written_at__:" + group);
    int count = Integer.parseInt(p.getProperty("fieldcount", "10"));
    String namePrefix = p.getProperty("fieldnameprefix", "field");
    List<String> names = new ArrayList<>(count);
    for (int i = 0; i < count; i++) {
      names.add(namePrefix + i);
    }
    allFields = List.copyOf(names);
  }

  byte[] entityKey(String id) {
    return (prefix + ":" + id).getBytes(StandardCharsets.UTF_8);
  }

  /** The flat layout's key of one value: the entity key, ':', then the same 4-byte field. */
  byte[] flatKey(String id, String feature) {
    byte[] entityKey = entityKey(id);
    return ByteBuffer.allocate(entityKey.length + 5)
        .put(entityKey).put((byte) ':').put(field(feature)).array();
  }

  static byte[] field(String featureName) {
    byte[] name = featureName.getBytes(StandardCharsets.UTF_8);
    return ByteBuffer.allocate(4).putInt(XXH32.hash(name, 0, name.length, FIELD_SEED)).array();
  }

  static byte[] timestamp() {
    return Long.toString(System.currentTimeMillis() / 1000).getBytes(StandardCharsets.US_ASCII);
  }
}
