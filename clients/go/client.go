// Package featurestore is a client of the feature store's gRPC serving API
// (proto/feature_store/proto/v1/serving.proto): batch lookups of many entities and many
// features, push writes, and the registry.
//
//	client, err := featurestore.Dial("127.0.0.1:50051", featurestore.Options{APIKey: key})
//	result, err := client.Get(ctx, featurestore.Lookup{
//		EntityType: "consumer", IntIDs: []int64{1, 2, 3}, Groups: []string{"consumer_features"},
//	})
//	for _, row := range result.Rows { fmt.Println(row.ID, row.Values, row.Statuses) }
//
// Values are decoded as the REST API answers them: float64 for float and double features,
// int64, bool, string, []float32 for embeddings and float lists, []int64 for int lists,
// nil when missing. A lookup that the server answers UNAVAILABLE (its Redis down, or the
// server restarting) is retried with backoff within the call's deadline.
package featurestore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	pb "github.com/feature-store/feature-store/clients/go/featurestorepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Options of a client. The zero value is a plaintext client with a 1 s deadline per call
// and 2 retries on UNAVAILABLE.
type Options struct {
	APIKey  string        // sent as "authorization: Bearer <key>" when set
	Timeout time.Duration // per call, retries included (default 1 s)
	Retries int           // retries of a call answered UNAVAILABLE (default 2; -1: none)
	TLS     *TLSOptions   // nil: plaintext
}

// TLSOptions: CA is the PEM file of the authority that signed the server's certificate
// (empty: the system's roots); Cert and Key, a client certificate for mutual TLS.
type TLSOptions struct {
	CA, Cert, Key string
	ServerName    string // the name to check the certificate against (default: the host)
}

// Client of one server. Safe for concurrent use; Close it when done.
type Client struct {
	conn    *grpc.ClientConn
	stub    pb.FeatureServiceClient
	apiKey  string
	timeout time.Duration
	retries int
}

// Dial makes a client of the server at addr (host:port). It connects lazily, at the first
// call.
func Dial(addr string, opts Options) (*Client, error) {
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		config, err := opts.TLS.config()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(config)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("featurestore: %s: %w", addr, err)
	}
	c := &Client{conn: conn, stub: pb.NewFeatureServiceClient(conn), apiKey: opts.APIKey}
	c.timeout = opts.Timeout
	if c.timeout <= 0 {
		c.timeout = time.Second
	}
	c.retries = opts.Retries
	if c.retries == 0 {
		c.retries = 2
	} else if c.retries < 0 {
		c.retries = 0
	}
	return c, nil
}

func (t *TLSOptions) config() (*tls.Config, error) {
	config := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("featurestore: TLS CA: %w", err)
		}
		config.RootCAs = x509.NewCertPool()
		if !config.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("featurestore: TLS CA %s holds no PEM certificate", t.CA)
		}
	}
	if t.Cert != "" || t.Key != "" {
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("featurestore: TLS client certificate: %w", err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return config, nil
}

// Close closes the client's connection.
func (c *Client) Close() error { return c.conn.Close() }

// Lookup is one batch get: ids of one entity type (IntIDs or StringIDs, as the entity
// type's id type says), and features (names, or "group:feature") and/or whole groups.
type Lookup struct {
	EntityType  string
	IntIDs      []int64
	StringIDs   []string
	Features    []string
	Groups      []string
	BypassCache bool // read Redis now, skipping the server's cache (write/admin keys)
}

// Row is one entity's answer: Values and Statuses aligned with Result.Features.
type Row struct {
	ID       any // int64 or string
	Values   []any
	Statuses []string         // "present", "missing", "stale" or "error"
	Ages     map[string]int64 // group -> seconds since its last write (absent: unknown)
}

// EntityError names an entity whose stored data of one group could not be read.
type EntityError struct {
	ID      any
	Group   string
	Reason  string // "undecodable_value", "corrupt_write_time" or "wrong_type"
	Message string
}

// Result of a lookup: one row per requested id, in order.
type Result struct {
	EntityType string
	Features   []string
	Rows       []Row
	Errors     []EntityError
}

// Get answers one lookup.
func (c *Client) Get(ctx context.Context, lookup Lookup) (*Result, error) {
	if (len(lookup.IntIDs) == 0) == (len(lookup.StringIDs) == 0) {
		return nil, errors.New("featurestore: give ids as IntIDs or as StringIDs (one of them)")
	}
	request := &pb.GetFeaturesRequest{
		EntityType:  lookup.EntityType,
		IntIds:      lookup.IntIDs,
		StringIds:   lookup.StringIDs,
		Features:    lookup.Features,
		Groups:      lookup.Groups,
		BypassCache: lookup.BypassCache,
	}
	var response *pb.GetFeaturesResponse
	err := c.call(ctx, func(ctx context.Context) (err error) {
		response, err = c.stub.GetFeatures(ctx, request)
		return err
	})
	if err != nil {
		return nil, err
	}
	result := &Result{
		EntityType: response.EntityType,
		Features:   response.Features,
		Rows:       make([]Row, len(response.Rows)),
	}
	for i, r := range response.Rows {
		row := Row{
			ID:       entityID(r.Id),
			Values:   make([]any, len(r.Values)),
			Statuses: make([]string, len(r.Statuses)),
			Ages:     r.Ages,
		}
		for j, v := range r.Values {
			row.Values[j] = Decode(v)
		}
		for j, s := range r.Statuses {
			row.Statuses[j] = statusName(s)
		}
		result.Rows[i] = row
	}
	for _, e := range response.Errors {
		result.Errors = append(result.Errors, EntityError{entityID(e.Id), e.Group, e.Reason, e.Message})
	}
	return result, nil
}

// WriteRow is one entity's values to push: a nil value removes the feature. EventTime is
// when the values were true (zero: now); a row older than what the store holds for its
// group is skipped.
type WriteRow struct {
	ID        any // int64 (or int) or string
	Values    map[string]any
	EventTime time.Time
}

// WriteStats is what a push write did.
type WriteStats struct {
	Entities, ValuesWritten, ValuesRemoved, Skipped int64
	SkippedIDs                                      []any
}

// Write pushes rows of one feature group (a write or admin key when keys are set).
func (c *Client) Write(ctx context.Context, group string, rows []WriteRow) (*WriteStats, error) {
	request := &pb.WriteFeaturesRequest{Group: group}
	for _, row := range rows {
		id, err := protoID(row.ID)
		if err != nil {
			return nil, err
		}
		values := make(map[string]*pb.Value, len(row.Values))
		for name, value := range row.Values {
			if values[name], err = Encode(value); err != nil {
				return nil, fmt.Errorf("featurestore: feature %q: %w", name, err)
			}
		}
		out := &pb.WriteRow{Id: id, Values: values}
		if !row.EventTime.IsZero() {
			out.EventTime = timestamppb.New(row.EventTime)
		}
		request.Rows = append(request.Rows, out)
	}
	var response *pb.WriteFeaturesResponse
	err := c.call(ctx, func(ctx context.Context) (err error) {
		response, err = c.stub.WriteFeatures(ctx, request)
		return err
	})
	if err != nil {
		return nil, err
	}
	stats := &WriteStats{
		Entities:      response.Entities,
		ValuesWritten: response.ValuesWritten,
		ValuesRemoved: response.ValuesRemoved,
		Skipped:       response.Skipped,
	}
	for _, id := range response.SkippedIds {
		stats.SkippedIDs = append(stats.SkippedIDs, entityID(id))
	}
	return stats, nil
}

// Registry answers the served entity types and feature groups.
func (c *Client) Registry(ctx context.Context) (*pb.GetRegistryResponse, error) {
	var response *pb.GetRegistryResponse
	err := c.call(ctx, func(ctx context.Context) (err error) {
		response, err = c.stub.GetRegistry(ctx, &pb.GetRegistryRequest{})
		return err
	})
	return response, err
}

// call runs one RPC under the client's deadline (or ctx's, if sooner) with its key,
// retrying UNAVAILABLE with backoff (20 ms, doubling) while the deadline allows.
func (c *Client) call(ctx context.Context, rpc func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if c.apiKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.apiKey)
	}
	backoff := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := rpc(ctx)
		if err == nil {
			return nil
		}
		if status.Code(err) != codes.Unavailable || attempt >= c.retries {
			return wrap(err)
		}
		select {
		case <-ctx.Done():
			return wrap(err)
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

// Error is a failed call: Code is gRPC's (InvalidArgument for a bad request, naming the
// problem; Unauthenticated or PermissionDenied for keys; Unavailable; DeadlineExceeded).
type Error struct {
	Code    codes.Code
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("featurestore: %s: %s", e.Code, e.Message) }

func wrap(err error) error {
	if s, ok := status.FromError(err); ok {
		return &Error{Code: s.Code(), Message: s.Message()}
	}
	return err
}

func entityID(id *pb.EntityId) any {
	if id == nil {
		return nil
	}
	switch v := id.Id.(type) {
	case *pb.EntityId_IntId:
		return v.IntId
	case *pb.EntityId_StringId:
		return v.StringId
	}
	return nil
}

func protoID(id any) (*pb.EntityId, error) {
	switch v := id.(type) {
	case int64:
		return &pb.EntityId{Id: &pb.EntityId_IntId{IntId: v}}, nil
	case int:
		return &pb.EntityId{Id: &pb.EntityId_IntId{IntId: int64(v)}}, nil
	case string:
		return &pb.EntityId{Id: &pb.EntityId_StringId{StringId: v}}, nil
	}
	return nil, fmt.Errorf("featurestore: an entity id is an int64 or a string, not %T", id)
}

var statusNames = map[pb.Status]string{
	pb.Status_PRESENT: "present",
	pb.Status_MISSING: "missing",
	pb.Status_STALE:   "stale",
	pb.Status_ERROR:   "error",
}

func statusName(s pb.Status) string {
	if name, ok := statusNames[s]; ok {
		return name
	}
	return "unspecified"
}
