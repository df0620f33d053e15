package dev.featurestore.client;

import com.google.gson.stream.JsonWriter;
import java.io.File;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.StringWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * Looks up features over the gRPC API and prints one JSON object per entity per line:
 * {"id": 1, "values": {"feature": value, ...}, "statuses": {...}}, values as the REST API
 * answers them (numbers, arrays, null; a NaN or infinite float as "NaN", "Infinity").
 *
 * <pre>
 * java -jar target/feature-get.jar -addr 127.0.0.1:50051 [-key KEY] -entity-type consumer \
 *     (-group consumer_features | -features float_00,int_0) -ids 1,2,3 [-string-ids]
 * </pre>
 */
public final class FeatureGet {
  private static final String USAGE =
      "usage: feature-get -addr HOST:PORT [-key KEY] -entity-type T (-group G | -features a,b)"
          + " -ids 1,2,3 [-string-ids] [-timeout-ms 1000] [-tls-ca ca.pem"
          + " [-tls-cert client.pem -tls-key client.key]]";

  public static void main(String[] args) throws IOException {
    Map<String, String> flags = new HashMap<>();
    for (int i = 0; i < args.length; i++) {
      String name = args[i].replaceFirst("^--?", "");
      if (name.equals("string-ids")) {
        flags.put(name, "true");
      } else if (i + 1 < args.length) {
        flags.put(name, args[++i]);
      } else {
        fail(2, "flag " + args[i] + " needs a value\n" + USAGE);
      }
    }
    String entityType = flags.get("entity-type");
    List<String> ids = split(flags.get("ids"));
    List<String> groups = split(flags.get("group"));
    List<String> features = split(flags.get("features"));
    if (entityType == null || ids.isEmpty() || (groups.isEmpty() && features.isEmpty())) {
      fail(2, "give -entity-type, -ids, and -group or -features\n" + USAGE);
    }
    FeatureClient.Lookup lookup;
    if (flags.containsKey("string-ids")) {
      lookup = FeatureClient.Lookup.ofStrings(entityType, ids);
    } else {
      List<Long> ints = new ArrayList<>();
      for (String id : ids) {
        try {
          ints.add(Long.parseLong(id));
        } catch (NumberFormatException e) {
          fail(2, "id " + id + " is not a 64-bit integer (use -string-ids for string ids)");
        }
      }
      lookup = FeatureClient.Lookup.ofInts(entityType, ints);
    }
    lookup = lookup.withGroups(groups).withFeatures(features);
    FeatureClient.Options options =
        new FeatureClient.Options()
            .apiKey(flags.get("key"))
            .timeout(Duration.ofMillis(Long.parseLong(flags.getOrDefault("timeout-ms", "1000"))));
    if (flags.containsKey("tls-ca")) {
      options.tls(new File(flags.get("tls-ca")));
      if (flags.containsKey("tls-cert")) {
        options.clientCertificate(new File(flags.get("tls-cert")), new File(flags.get("tls-key")));
      }
    }
    FeatureClient.Result result;
    try (FeatureClient client =
        FeatureClient.connect(flags.getOrDefault("addr", "127.0.0.1:50051"), options)) {
      result = client.get(lookup);
    } catch (FeatureClient.FeatureStoreException e) {
      fail(1, e.getMessage());
      return;
    }
    Writer out = new OutputStreamWriter(System.out, StandardCharsets.UTF_8);
    for (FeatureClient.Row row : result.rows()) {
      out.write(line(result.features(), row));
      out.write('\n');
    }
    out.flush();
    for (FeatureClient.EntityError e : result.errors()) {
      System.err.println("error: entity " + e.id() + " group " + e.group() + ": " + e.message());
    }
  }

  static String line(List<String> features, FeatureClient.Row row) throws IOException {
    StringWriter text = new StringWriter();
    JsonWriter json = new JsonWriter(text);
    json.beginObject().name("id");
    if (row.id() instanceof String s) {
      json.value(s);
    } else {
      json.value((Long) row.id());
    }
    json.name("values").beginObject();
    for (int i = 0; i < features.size(); i++) {
      json.name(features.get(i));
      value(json, row.values().get(i));
    }
    json.endObject().name("statuses").beginObject();
    for (int i = 0; i < features.size(); i++) {
      json.name(features.get(i)).value(row.statuses().get(i));
    }
    json.endObject().endObject().close();
    return text.toString();
  }

  private static void value(JsonWriter json, Object v) throws IOException {
    if (v == null) {
      json.nullValue();
    } else if (v instanceof Double d) {
      floating(json, d, shortest(d, false));
    } else if (v instanceof float[] floats) {
      json.beginArray();
      for (float f : floats) {
        floating(json, f, shortest(f, true));
      }
      json.endArray();
    } else if (v instanceof long[] longs) {
      json.beginArray();
      for (long x : longs) {
        json.value(x);
      }
      json.endArray();
    } else if (v instanceof Long l) {
      json.value(l);
    } else if (v instanceof Boolean b) {
      json.value(b);
    } else {
      json.value(v.toString());
    }
  }

  /** A float at its own precision (float32 list elements as float32's shortest text). */
  private static void floating(JsonWriter json, double x, String text) throws IOException {
    if (Double.isNaN(x)) {
      json.value("NaN");
    } else if (Double.isInfinite(x)) {
      json.value(x > 0 ? "Infinity" : "-Infinity");
    } else {
      json.jsonValue(text);
    }
  }

  /**
   * The shortest decimal that reads back as x (as a float32 if float32), as the REST API
   * writes it: Java 17's Float.toString and Double.toString may give more digits than that.
   */
  static String shortest(double x, boolean float32) {
    if (x == 0 || Double.isNaN(x) || Double.isInfinite(x)) {
      return float32 ? Float.toString((float) x) : Double.toString(x);
    }
    for (int digits = 1; digits < 17; digits++) {
      String text = String.format(Locale.ROOT, "%." + (digits - 1) + "e", x);
      if (float32 ? Float.parseFloat(text) == (float) x : Double.parseDouble(text) == x) {
        return text;
      }
    }
    return String.format(Locale.ROOT, "%.16e", x);
  }

  private static List<String> split(String list) {
    List<String> out = new ArrayList<>();
    if (list != null) {
      for (String item : list.split(",")) {
        if (!item.isBlank()) {
          out.add(item.trim());
        }
      }
    }
    return out;
  }

  private static void fail(int code, String message) {
    System.err.println("feature-get: " + message);
    System.exit(code);
  }
}
