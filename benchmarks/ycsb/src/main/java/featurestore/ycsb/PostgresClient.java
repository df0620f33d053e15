package featurestore.ycsb;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.Vector;

import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * PostgreSQL as a plain key-value table, {@code (key text primary key, value bytea)}, one row
 * per (entity, feature) with the key {@code "{prefix}:{id}:{feature}"}: the schema the
 * disk-based stores of the production comparison used. A batch read of K keys x F fields is
 * one {@code SELECT key, value ... WHERE key IN (?, ... K*F)}; writes are one multi-row upsert.
 * One connection per YCSB thread, autocommit.
 *
 * <p>Properties: postgres.url (jdbc:postgresql://...), postgres.user, postgres.password,
 * postgres.table (default kv), fs.prefix.
 */
public class PostgresClient extends DB implements BatchReader {
  private static final Object SCHEMA_LOCK = new Object();
  private static boolean schemaReady;

  private Connection conn;
  private Layout layout;
  private String table;
  private final Map<Integer, PreparedStatement> selects = new HashMap<>();
  private final Map<Integer, PreparedStatement> upserts = new HashMap<>();

  @Override
  public void init() throws DBException {
    layout = new Layout(getProperties());
    table = getProperties().getProperty("postgres.table", "kv");
    if (!table.matches("[a-z_][a-z0-9_]*")) {
      throw new DBException("postgres.table must be a plain lower-case identifier: " + table);
    }
    String url = getProperties().getProperty("postgres.url");
    if (url == null) {
      throw new DBException("set postgres.url, e.g. jdbc:postgresql://127.0.0.1:5432/postgres");
    }
    try {
      conn = DriverManager.getConnection(url, getProperties().getProperty("postgres.user", ""),
          getProperties().getProperty("postgres.password", ""));
      conn.setAutoCommit(true);
      synchronized (SCHEMA_LOCK) {
        if (!schemaReady) {
          try (Statement st = conn.createStatement()) {
            st.execute("CREATE TABLE IF NOT EXISTS " + table
                + " (key text PRIMARY KEY, value bytea NOT NULL)");
          }
          schemaReady = true;
        }
      }
    } catch (SQLException e) {
      throw new DBException("cannot connect to PostgreSQL at " + url + ": " + e.getMessage(), e);
    }
  }

  @Override
  public void cleanup() throws DBException {
    try {
      conn.close();
    } catch (SQLException e) {
      throw new DBException(e);
    }
  }

  private String rowKey(String id, String feature) {
    return layout.prefix + ":" + id + ":" + feature;
  }

  private PreparedStatement select(int n) throws SQLException {
    PreparedStatement ps = selects.get(n);
    if (ps == null) {
      StringBuilder sql = new StringBuilder("SELECT key, value FROM ").append(table)
          .append(" WHERE key IN (");
      for (int i = 0; i < n; i++) {
        sql.append(i == 0 ? "?" : ", ?");
      }
      ps = conn.prepareStatement(sql.append(')').toString());
      selects.put(n, ps);
    }
    return ps;
  }

  private PreparedStatement upsert(int n) throws SQLException {
    PreparedStatement ps = upserts.get(n);
    if (ps == null) {
      StringBuilder sql = new StringBuilder("INSERT INTO ").append(table)
          .append(" (key, value) VALUES ");
      for (int i = 0; i < n; i++) {
        sql.append(i == 0 ? "(?, ?)" : ", (?, ?)");
      }
      sql.append(" ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value");
      ps = conn.prepareStatement(sql.toString());
      upserts.put(n, ps);
    }
    return ps;
  }

  @Override
  public Status read(String table, String key, Set<String> fields,
                     Map<String, ByteIterator> result) {
    // all fields: the record's, as the core workload names them (a key-value table does not list an entity's features)
    List<String> names = fields == null ? layout.allFields : new ArrayList<>(fields);
    List<Map<String, ByteIterator>> rows = new ArrayList<>(1);
    Status status = batchRead(table, List.of(key), names, rows);
    if (!rows.isEmpty()) {
      result.putAll(rows.get(0));
    }
    return status;
  }

  @Override
  public Status batchRead(String tableName, List<String> keys, List<String> fields,
                          List<Map<String, ByteIterator>> result) {
    // A skewed distribution repeats keys; IN matches each row once, so ask for each once.
    Set<String> wanted = new LinkedHashSet<>();
    for (String id : keys) {
      for (String f : fields) {
        wanted.add(rowKey(id, f));
      }
    }
    try {
      PreparedStatement ps = select(wanted.size());
      int i = 1;
      for (String k : wanted) {
        ps.setString(i++, k);
      }
      Map<String, byte[]> found = new HashMap<>(wanted.size() * 2);
      try (ResultSet rs = ps.executeQuery()) {
        while (rs.next()) {
          found.put(rs.getString(1), rs.getBytes(2));
        }
      }
      Status status = Status.OK;
      for (String id : keys) {
        Map<String, ByteIterator> row = new HashMap<>(fields.size() * 2);
        for (String f : fields) {
          byte[] v = found.get(rowKey(id, f));
          if (v == null) {
            status = Status.NOT_FOUND;
          } else {
            row.put(f, new ByteArrayByteIterator(v));
          }
        }
        result.add(row);
      }
      return status;
    } catch (SQLException e) {
      Errors.report("postgres", "sql", e);
      return Status.ERROR;
    }
  }

  @Override
  public Status scan(String tableName, String startkey, int recordcount, Set<String> fields,
                     Vector<HashMap<String, ByteIterator>> result) {
    return Status.NOT_IMPLEMENTED;
  }

  @Override
  public Status update(String tableName, String key, Map<String, ByteIterator> values) {
    return insert(tableName, key, values);
  }

  @Override
  public Status insert(String tableName, String key, Map<String, ByteIterator> values) {
    try {
      PreparedStatement ps = upsert(values.size());
      int i = 1;
      for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
        ps.setString(i++, rowKey(key, e.getKey()));
        ps.setBytes(i++, e.getValue().toArray());
      }
      return ps.executeUpdate() == values.size() ? Status.OK : Status.ERROR;
    } catch (SQLException e) {
      Errors.report("postgres", "sql", e);
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String tableName, String key) {
    return Status.NOT_IMPLEMENTED;  // no workload deletes
  }
}
