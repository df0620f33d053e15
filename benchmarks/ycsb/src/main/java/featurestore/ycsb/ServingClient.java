package featurestore.ycsb;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.Vector;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;
import site.ycsb.StringByteIterator;

/**
 * The project's REST API over loopback: a batch read is one {@code POST /v1/features/get} of
 * K ids x F features, a write one {@code POST /v1/features/write} of one entity. YCSB's fields
 * are string features of a string-id entity type ({@code fs.entity}, group {@code fs.group}),
 * so what the hash binding loads is what this binding reads.
 *
 * <p>A read is OK only when every value comes back with status {@code present}.
 *
 * <p>Properties: serving.url (default http://127.0.0.1:8000), serving.timeout (ms),
 * serving.apikey (sent as a Bearer token when set), serving.bypasscache (default false),
 * fs.entity, fs.group.
 */
public class ServingClient extends DB implements BatchReader {
  private static final ObjectMapper JSON = new ObjectMapper();

  private HttpClient http;
  private URI getUri;
  private URI writeUri;
  private Duration timeout;
  private String apiKey;
  private boolean bypassCache;
  private Layout layout;

  @Override
  public void init() throws DBException {
    layout = new Layout(getProperties());
    String base = getProperties().getProperty("serving.url", "http://127.0.0.1:8000");
    getUri = URI.create(base + "/v1/features/get");
    writeUri = URI.create(base + "/v1/features/write");
    timeout = Duration.ofMillis(Long.parseLong(
        getProperties().getProperty("serving.timeout", "5000")));
    apiKey = getProperties().getProperty("serving.apikey");
    bypassCache = Boolean.parseBoolean(getProperties().getProperty("serving.bypasscache", "false"));
    // HTTP/1.1 with keep-alive: uvicorn speaks no h2c, and the client reuses its connection.
    http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
        .connectTimeout(timeout).build();
  }

  private JsonNode post(URI uri, ObjectNode body) throws IOException, InterruptedException {
    HttpRequest.Builder req = HttpRequest.newBuilder(uri).timeout(timeout)
        .header("Content-Type", "application/json")
        .POST(HttpRequest.BodyPublishers.ofByteArray(JSON.writeValueAsBytes(body)));
    if (apiKey != null) {
      req.header("Authorization", "Bearer " + apiKey);
    }
    HttpResponse<byte[]> resp = http.send(req.build(), HttpResponse.BodyHandlers.ofByteArray());
    if (resp.statusCode() != 200) {
      throw new IOException("HTTP " + resp.statusCode() + " from " + uri + ": "
          + new String(resp.body(), java.nio.charset.StandardCharsets.UTF_8));
    }
    return JSON.readTree(resp.body());
  }

  @Override
  public Status read(String table, String key, Set<String> fields,
                     Map<String, ByteIterator> result) {
    if (fields == null) {
      fields = Set.of();  // the group's features, below
    }
    List<Map<String, ByteIterator>> rows = new ArrayList<>(1);
    Status status = batchRead(table, List.of(key), new ArrayList<>(fields), rows);
    if (!rows.isEmpty()) {
      result.putAll(rows.get(0));
    }
    return status;
  }

  @Override
  public Status batchRead(String table, List<String> keys, List<String> fields,
                          List<Map<String, ByteIterator>> result) {
    ObjectNode body = JSON.createObjectNode();
    body.put("entity_type", layout.entity);
    ArrayNode ids = body.putArray("ids");
    keys.forEach(ids::add);
    if (fields.isEmpty()) {
      body.putArray("groups").add(layout.group);
    } else {
      ArrayNode names = body.putArray("features");
      fields.forEach(names::add);
    }
    if (bypassCache) {
      body.put("bypass_cache", true);
    }
    try {
      JsonNode resp = post(getUri, body);
      JsonNode names = resp.get("features");
      JsonNode results = resp.get("results");
      if (names == null || results == null || results.size() != keys.size()) {
        Errors.report("serving", "unexpected response shape: " + resp);
        return Status.UNEXPECTED_STATE;
      }
      Status status = Status.OK;
      for (JsonNode r : results) {
        JsonNode values = r.get("values");
        JsonNode statuses = r.get("statuses");
        Map<String, ByteIterator> row = new HashMap<>(names.size() * 2);
        for (int i = 0; i < names.size(); i++) {
          String valueStatus = statuses.get(i).asText();
          if (!"present".equals(valueStatus)) {
            if (status.isOk()) {
              Errors.report("serving", "entity " + r.get("id") + " feature " + names.get(i)
                  + " is " + valueStatus + " (ages " + r.get("ages") + ")");
            }
            status = Status.NOT_FOUND;
          } else {
            row.put(names.get(i).asText(), new StringByteIterator(values.get(i).asText()));
          }
        }
        result.add(row);
      }
      return status;
    } catch (IOException e) {
      Errors.report("serving", "read", e);
      return Status.ERROR;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
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
    ObjectNode body = JSON.createObjectNode();
    body.put("group", layout.group);
    ObjectNode row = body.putArray("rows").addObject();
    row.put("id", key);
    ObjectNode vals = row.putObject("values");
    for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
      vals.put(e.getKey(), e.getValue().toString());
    }
    try {
      JsonNode resp = post(writeUri, body);
      JsonNode written = resp.get("values_written");
      JsonNode skipped = resp.get("skipped");
      if (written == null) {
        Errors.report("serving", "write: no values_written in " + resp);
        return Status.ERROR;
      }
      return Writes.outcome("serving", written.asLong(), skipped == null ? 0 : skipped.asLong(),
          values.size());
    } catch (IOException e) {
      Errors.report("serving", "write", e);
      return Status.ERROR;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    return Status.NOT_IMPLEMENTED;
  }
}
