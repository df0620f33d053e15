package dev.featurestore.client;

import com.google.protobuf.Timestamp;
import dev.featurestore.proto.v1.EntityId;
import dev.featurestore.proto.v1.FeatureRow;
import dev.featurestore.proto.v1.FeatureServiceGrpc;
import dev.featurestore.proto.v1.FloatList;
import dev.featurestore.proto.v1.GetFeaturesRequest;
import dev.featurestore.proto.v1.GetFeaturesResponse;
import dev.featurestore.proto.v1.GetRegistryRequest;
import dev.featurestore.proto.v1.GetRegistryResponse;
import dev.featurestore.proto.v1.IntList;
import dev.featurestore.proto.v1.Value;
import dev.featurestore.proto.v1.WriteFeaturesRequest;
import dev.featurestore.proto.v1.WriteFeaturesResponse;
import io.grpc.CallCredentials;
import io.grpc.ChannelCredentials;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import java.io.File;
import java.io.IOException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

/**
 * A client of the feature store's gRPC serving API: batch lookups of many entities and many
 * features, push writes, and the registry.
 *
 * <pre>{@code
 * try (FeatureClient client = FeatureClient.connect("127.0.0.1:50051", new FeatureClient.Options())) {
 *   FeatureClient.Result result = client.get(FeatureClient.Lookup.ofInts("consumer", List.of(1L, 2L))
 *       .withGroups(List.of("consumer_features")));
 *   for (FeatureClient.Row row : result.rows()) System.out.println(row.id() + " " + row.values());
 * }
 * }</pre>
 *
 * <p>Values are decoded as the REST API answers them: Double for float and double features,
 * Long, Boolean, String, float[] for embeddings and float lists, long[] for int lists, null
 * when missing. A call the server answers UNAVAILABLE is retried with backoff within its
 * deadline.
 */
public final class FeatureClient implements AutoCloseable {

  /** Options of a client: an API key, a deadline per call (retries included), retries, TLS. */
  public static final class Options {
    String apiKey;
    Duration timeout = Duration.ofSeconds(1);
    int retries = 2;
    File tlsCa;
    File tlsCert;
    File tlsKey;

    public Options apiKey(String key) {
      this.apiKey = key;
      return this;
    }

    public Options timeout(Duration timeout) {
      this.timeout = timeout;
      return this;
    }

    /** Retries of a call answered UNAVAILABLE (default 2). */
    public Options retries(int retries) {
      this.retries = retries;
      return this;
    }

    /** TLS, trusting the CA in this PEM file. */
    public Options tls(File ca) {
      this.tlsCa = ca;
      return this;
    }

    /** Mutual TLS: a client certificate and its key, PEM. */
    public Options clientCertificate(File cert, File key) {
      this.tlsCert = cert;
      this.tlsKey = key;
      return this;
    }
  }

  /** One batch get: ids of one entity type, features ("name" or "group:feature"), groups. */
  public record Lookup(
      String entityType,
      List<Long> intIds,
      List<String> stringIds,
      List<String> features,
      List<String> groups,
      boolean bypassCache) {
    public static Lookup ofInts(String entityType, List<Long> ids) {
      return new Lookup(entityType, ids, List.of(), List.of(), List.of(), false);
    }

    public static Lookup ofStrings(String entityType, List<String> ids) {
      return new Lookup(entityType, List.of(), ids, List.of(), List.of(), false);
    }

    public Lookup withFeatures(List<String> names) {
      return new Lookup(entityType, intIds, stringIds, names, groups, bypassCache);
    }

    public Lookup withGroups(List<String> names) {
      return new Lookup(entityType, intIds, stringIds, features, names, bypassCache);
    }
  }

  /** One entity's answer: values and statuses aligned with {@link Result#features()}. */
  public record Row(Object id, List<Object> values, List<String> statuses, Map<String, Long> ages) {}

  /** An entity whose stored data of one group could not be read. */
  public record EntityError(Object id, String group, String reason, String message) {}

  /** The answer of a lookup: one row per requested id, in order. */
  public record Result(String entityType, List<String> features, List<Row> rows, List<EntityError> errors) {}

  /** One entity's values to push; a null value removes the feature; eventTime null: now. */
  public record WriteRow(Object id, Map<String, Object> values, Instant eventTime) {}

  /** What a push write did. */
  public record WriteStats(long entities, long valuesWritten, long valuesRemoved, long skipped, List<Object> skippedIds) {}

  /** A failed call: the gRPC status (INVALID_ARGUMENT names the problem in the request). */
  public static final class FeatureStoreException extends RuntimeException {
    private final Status.Code code;

    FeatureStoreException(Status status) {
      super(status.getCode() + ": " + status.getDescription());
      this.code = status.getCode();
    }

    public Status.Code code() {
      return code;
    }
  }

  private final ManagedChannel channel;
  private final FeatureServiceGrpc.FeatureServiceBlockingStub stub;
  private final Duration timeout;
  private final int retries;

  private FeatureClient(ManagedChannel channel, Options options) {
    this.channel = channel;
    FeatureServiceGrpc.FeatureServiceBlockingStub stub = FeatureServiceGrpc.newBlockingStub(channel);
    if (options.apiKey != null && !options.apiKey.isEmpty()) {
      stub = stub.withCallCredentials(new Bearer(options.apiKey));
    }
    this.stub = stub;
    this.timeout = options.timeout;
    this.retries = options.retries;
  }

  /** A client of the server at host:port. It connects at the first call. */
  public static FeatureClient connect(String address, Options options) throws IOException {
    ChannelCredentials credentials = InsecureChannelCredentials.create();
    if (options.tlsCa != null) {
      TlsChannelCredentials.Builder tls = TlsChannelCredentials.newBuilder().trustManager(options.tlsCa);
      if (options.tlsCert != null) {
        tls.keyManager(options.tlsCert, options.tlsKey);
      }
      credentials = tls.build();
    }
    return new FeatureClient(Grpc.newChannelBuilder(address, credentials).build(), options);
  }

  public Result get(Lookup lookup) {
    if (lookup.intIds().isEmpty() == lookup.stringIds().isEmpty()) {
      throw new IllegalArgumentException("give ids as intIds or as stringIds (one of them)");
    }
    GetFeaturesRequest request =
        GetFeaturesRequest.newBuilder()
            .setEntityType(lookup.entityType())
            .addAllIntIds(lookup.intIds())
            .addAllStringIds(lookup.stringIds())
            .addAllFeatures(lookup.features())
            .addAllGroups(lookup.groups())
            .setBypassCache(lookup.bypassCache())
            .build();
    GetFeaturesResponse response = call(s -> s.getFeatures(request));
    List<Row> rows = new ArrayList<>(response.getRowsCount());
    for (FeatureRow r : response.getRowsList()) {
      List<Object> values = new ArrayList<>(r.getValuesCount());
      for (Value v : r.getValuesList()) {
        values.add(decode(v));
      }
      List<String> statuses = new ArrayList<>(r.getStatusesCount());
      for (dev.featurestore.proto.v1.Status s : r.getStatusesList()) {
        statuses.add(s == dev.featurestore.proto.v1.Status.STATUS_UNSPECIFIED ? "unspecified" : s.name().toLowerCase());
      }
      rows.add(new Row(id(r.getId()), values, statuses, r.getAgesMap()));
    }
    List<EntityError> errors = new ArrayList<>();
    for (dev.featurestore.proto.v1.EntityError e : response.getErrorsList()) {
      errors.add(new EntityError(id(e.getId()), e.getGroup(), e.getReason(), e.getMessage()));
    }
    return new Result(response.getEntityType(), response.getFeaturesList(), rows, errors);
  }

  public WriteStats write(String group, List<WriteRow> rows) {
    WriteFeaturesRequest.Builder request = WriteFeaturesRequest.newBuilder().setGroup(group);
    for (WriteRow row : rows) {
      dev.featurestore.proto.v1.WriteRow.Builder out =
          dev.featurestore.proto.v1.WriteRow.newBuilder().setId(protoId(row.id()));
      row.values().forEach((name, value) -> out.putValues(name, encode(value)));
      if (row.eventTime() != null) {
        Instant t = row.eventTime();
        out.setEventTime(Timestamp.newBuilder().setSeconds(t.getEpochSecond()).setNanos(t.getNano()));
      }
      request.addRows(out);
    }
    WriteFeaturesRequest built = request.build();
    WriteFeaturesResponse r = call(s -> s.writeFeatures(built));
    List<Object> skipped = new ArrayList<>();
    for (EntityId id : r.getSkippedIdsList()) {
      skipped.add(id(id));
    }
    return new WriteStats(r.getEntities(), r.getValuesWritten(), r.getValuesRemoved(), r.getSkipped(), skipped);
  }

  public GetRegistryResponse registry() {
    return call(s -> s.getRegistry(GetRegistryRequest.getDefaultInstance()));
  }

  /** One RPC under the client's deadline, UNAVAILABLE retried (20 ms, doubling) within it. */
  private <T> T call(Function<FeatureServiceGrpc.FeatureServiceBlockingStub, T> rpc) {
    long deadline = System.nanoTime() + timeout.toNanos();
    long backoffMs = 20;
    for (int attempt = 0; ; attempt++) {
      long left = deadline - System.nanoTime();
      try {
        return rpc.apply(stub.withDeadlineAfter(Math.max(left, 1), TimeUnit.NANOSECONDS));
      } catch (StatusRuntimeException e) {
        boolean retry = e.getStatus().getCode() == Status.Code.UNAVAILABLE && attempt < retries;
        if (!retry || deadline - System.nanoTime() <= TimeUnit.MILLISECONDS.toNanos(backoffMs)) {
          throw new FeatureStoreException(e.getStatus());
        }
        try {
          Thread.sleep(backoffMs);
        } catch (InterruptedException interrupted) {
          Thread.currentThread().interrupt();
          throw new FeatureStoreException(e.getStatus());
        }
        backoffMs *= 2;
      }
    }
  }

  /** A Value as the REST API answers it (see the class comment). */
  public static Object decode(Value v) {
    switch (v.getKindCase()) {
      case FLOAT_VALUE:
        return v.getFloatValue();
      case INT_VALUE:
        return v.getIntValue();
      case BOOL_VALUE:
        return v.getBoolValue();
      case STRING_VALUE:
        return v.getStringValue();
      case FLOAT_LIST:
        {
          float[] out = new float[v.getFloatList().getValuesCount()];
          for (int i = 0; i < out.length; i++) {
            out[i] = v.getFloatList().getValues(i);
          }
          return out;
        }
      case INT_LIST:
        return v.getIntList().getValuesList().stream().mapToLong(Long::longValue).toArray();
      default:
        return null;
    }
  }

  /** The Value of a Java value to write; null removes the feature. */
  public static Value encode(Object value) {
    Value.Builder v = Value.newBuilder();
    if (value == null) {
      return v.build();
    } else if (value instanceof Double || value instanceof Float) {
      return v.setFloatValue(((Number) value).doubleValue()).build();
    } else if (value instanceof Long || value instanceof Integer) {
      return v.setIntValue(((Number) value).longValue()).build();
    } else if (value instanceof Boolean b) {
      return v.setBoolValue(b).build();
    } else if (value instanceof String s) {
      return v.setStringValue(s).build();
    } else if (value instanceof float[] floats) {
      FloatList.Builder list = FloatList.newBuilder();
      for (float f : floats) {
        list.addValues(f);
      }
      return v.setFloatList(list).build();
    } else if (value instanceof long[] ints) {
      IntList.Builder list = IntList.newBuilder();
      for (long x : ints) {
        list.addValues(x);
      }
      return v.setIntList(list).build();
    }
    throw new IllegalArgumentException("no feature type holds a " + value.getClass().getName());
  }

  private static Object id(EntityId id) {
    return id.getIdCase() == EntityId.IdCase.STRING_ID ? id.getStringId() : (Object) id.getIntId();
  }

  private static EntityId protoId(Object id) {
    if (id instanceof Long || id instanceof Integer) {
      return EntityId.newBuilder().setIntId(((Number) id).longValue()).build();
    } else if (id instanceof String s) {
      return EntityId.newBuilder().setStringId(s).build();
    }
    throw new IllegalArgumentException("an entity id is a long or a string, not " + id);
  }

  @Override
  public void close() {
    channel.shutdown();
    try {
      if (!channel.awaitTermination(5, TimeUnit.SECONDS)) {
        channel.shutdownNow();
      }
    } catch (InterruptedException e) {
      channel.shutdownNow();
      Thread.currentThread().interrupt();
    }
  }

  /** "authorization: Bearer KEY" on every call. */
  private static final class Bearer extends CallCredentials {
    private static final Metadata.Key<String> AUTHORIZATION =
        Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    private final String key;

    Bearer(String key) {
      this.key = key;
    }

    @Override
    public void applyRequestMetadata(RequestInfo info, Executor executor, MetadataApplier applier) {
      Metadata headers = new Metadata();
      headers.put(AUTHORIZATION, "Bearer " + key);
      applier.apply(headers);
    }
  }
}
