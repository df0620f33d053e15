// feature-get looks up features over the gRPC API and prints one JSON object per entity
// per line: {"id": 1, "values": {"<feature>": <value>, ...}, "statuses": {...}}, values
// as the REST API answers them.
//
//	go run ./cmd/feature-get -addr 127.0.0.1:50051 -entity-type consumer \
//	    -group consumer_features -ids 1,2,3
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	featurestore "github.com/feature-store/feature-store/clients/go"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "the server's gRPC address, host:port")
	key := flag.String("key", "", "API key (a read key when keys are set)")
	entityType := flag.String("entity-type", "", "entity type, e.g. consumer")
	group := flag.String("group", "", "feature groups, comma-separated")
	features := flag.String("features", "", "feature names (or group:feature), comma-separated")
	ids := flag.String("ids", "", "entity ids, comma-separated")
	stringIDs := flag.Bool("string-ids", false, "the ids are strings (default: int64)")
	timeout := flag.Duration("timeout", time.Second, "deadline of the call, retries included")
	ca := flag.String("tls-ca", "", "TLS: the CA's PEM file (plaintext without -tls-ca)")
	cert := flag.String("tls-cert", "", "mutual TLS: this client's certificate, PEM")
	certKey := flag.String("tls-key", "", "mutual TLS: its private key, PEM")
	flag.Parse()
	if *entityType == "" || *ids == "" || (*group == "" && *features == "") {
		fmt.Fprintln(os.Stderr, "feature-get: give -entity-type, -ids, and -group or -features")
		flag.Usage()
		os.Exit(2)
	}
	options := featurestore.Options{APIKey: *key, Timeout: *timeout}
	if *ca != "" {
		options.TLS = &featurestore.TLSOptions{CA: *ca, Cert: *cert, Key: *certKey}
	}
	lookup := featurestore.Lookup{
		EntityType: *entityType,
		Groups:     split(*group),
		Features:   split(*features),
	}
	for _, id := range split(*ids) {
		if *stringIDs {
			lookup.StringIDs = append(lookup.StringIDs, id)
			continue
		}
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			fail(fmt.Errorf("id %q is not an int64 (use -string-ids for string ids)", id))
		}
		lookup.IntIDs = append(lookup.IntIDs, n)
	}
	client, err := featurestore.Dial(*addr, options)
	if err != nil {
		fail(err)
	}
	defer client.Close()
	result, err := client.Get(context.Background(), lookup)
	if err != nil {
		fail(err)
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for _, row := range result.Rows {
		values := make(featurestore.Object, len(result.Features))
		statuses := make(featurestore.Object, len(result.Features))
		for i, name := range result.Features {
			values[i] = featurestore.Member{Name: name, Value: featurestore.JSON{Value: row.Values[i]}}
			statuses[i] = featurestore.Member{Name: name, Value: row.Statuses[i]}
		}
		line, err := json.Marshal(featurestore.Object{
			{Name: "id", Value: row.ID},
			{Name: "values", Value: values},
			{Name: "statuses", Value: statuses},
		})
		if err != nil {
			fail(err)
		}
		out.Write(append(line, '\n'))
	}
	for _, e := range result.Errors {
		fmt.Fprintf(os.Stderr, "error: entity %v group %s: %s\n", e.ID, e.Group, e.Message)
	}
}

func split(list string) []string {
	var out []string
	for _, item := range strings.Split(list, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "feature-get:", err)
	os.Exit(1)
}
