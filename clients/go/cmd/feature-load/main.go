// feature-load drives a feature store's gRPC API with batch lookups for a fixed time and
// prints what it measured as one JSON object: requests answered, errors, seconds, and the
// latency percentiles and maximum in milliseconds.
//
// Each call asks for one batch of ids drawn at random from -batches (a file of one batch
// per line, ids comma-separated), so that lookups spread over a working set as a model
// server's do (h2load repeats one request body). -c connections each carry -streams
// concurrent calls in a closed loop. Compiled, and sending requests encoded once and
// taking answers as bytes (their length checked, not decoded), it leaves the cores to the
// server it measures.
//
//	go run ./cmd/feature-load -addr 127.0.0.1:50051 -entity-type consumer \
//	    -group consumer_features -batches batches.txt -c 8 -d 10s
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	pb "github.com/feature-store/feature-store/clients/go/featurestorepb"
)

type result struct {
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	Seconds  float64 `json:"seconds"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	Slow     int     `json:"slow"` // calls that took longer than -slow
	// this process's own CPU (user and system) over the run, to report beside the server's
	CPUSeconds float64 `json:"cpu_seconds"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "the server's gRPC address, host:port")
	key := flag.String("key", "", "API key (a read key when keys are set)")
	entityType := flag.String("entity-type", "", "entity type, e.g. consumer")
	group := flag.String("group", "", "feature groups, comma-separated")
	features := flag.String("features", "", "feature names (or group:feature), comma-separated")
	batchFile := flag.String("batches", "", "file of batches: one per line, int64 ids comma-separated")
	connections := flag.Int("c", 8, "connections")
	streams := flag.Int("streams", 1, "concurrent calls per connection")
	duration := flag.Duration("d", 10*time.Second, "how long to send calls")
	timeout := flag.Duration("timeout", 5*time.Second, "deadline of each call")
	slow := flag.Duration("slow", time.Second, "a call longer than this is counted as slow")
	seed := flag.Int64("seed", 1, "seed of the draws of batches")
	procs := flag.Int("procs", 1, "cores this process may run on at once (GOMAXPROCS): one by "+
		"default, to leave the others to the server it measures")
	flag.Parse()
	runtime.GOMAXPROCS(*procs)
	if *entityType == "" || *batchFile == "" || (*group == "" && *features == "") {
		fmt.Fprintln(os.Stderr, "feature-load: give -entity-type, -batches, and -group or -features")
		flag.Usage()
		os.Exit(2)
	}
	if *connections < 1 || *streams < 1 {
		fail(errors.New("-c and -streams must be at least 1"))
	}
	batches, err := readBatches(*batchFile)
	if err != nil {
		fail(err)
	}
	requests := make([]rawMessage, len(batches))
	for i, ids := range batches {
		encoded, err := proto.Marshal(&pb.GetFeaturesRequest{
			EntityType: *entityType,
			IntIds:     ids,
			Groups:     split(*group),
			Features:   split(*features),
		})
		if err != nil {
			fail(err)
		}
		requests[i] = encoded
	}
	ctx := context.Background()
	if *key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+*key)
	}
	conns := make([]*grpc.ClientConn, *connections)
	for i := range conns {
		// one ClientConn each: its own TCP connection
		conn, err := grpc.NewClient(
			*addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})),
		)
		if err != nil {
			fail(err)
		}
		defer conn.Close()
		conns[i] = conn
	}

	var mu sync.Mutex
	var latencies []time.Duration
	errorCount := 0
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(*duration)
	for i := 0; i < *connections**streams; i++ {
		wg.Add(1)
		go func(worker int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(*seed + int64(worker)))
			conn := conns[worker%*connections]
			var answer rawMessage
			own := make([]time.Duration, 0, 1<<14)
			failed := 0
			for time.Now().Before(end) {
				call, cancel := context.WithTimeout(ctx, *timeout)
				t := time.Now()
				request := requests[rng.Intn(len(requests))]
				err := conn.Invoke(call, pb.FeatureService_GetFeatures_FullMethodName, &request, &answer)
				if err == nil && len(answer) == 0 {
					err = errors.New("an empty answer")
				}
				took := time.Since(t)
				cancel()
				if err != nil {
					failed++
					continue
				}
				own = append(own, took)
			}
			mu.Lock()
			latencies = append(latencies, own...)
			errorCount += failed
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	seconds := time.Since(start).Seconds()
	sort.Slice(latencies, func(a, b int) bool { return latencies[a] < latencies[b] })
	out := result{Requests: len(latencies), Errors: errorCount, Seconds: seconds}
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err == nil {
		out.CPUSeconds = float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
	}
	if n := len(latencies); n > 0 {
		out.P50Ms = ms(latencies[n*50/100])
		out.P99Ms = ms(latencies[min(n-1, n*99/100)])
		out.MaxMs = ms(latencies[n-1])
		out.Slow = n - sort.Search(n, func(i int) bool { return latencies[i] > *slow })
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}

// rawMessage is a message as its protobuf bytes: a request encoded once, an answer kept as
// it came.
type rawMessage []byte

// rawCodec sends and takes rawMessages as they are (named "proto": what they are on the
// wire).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(*rawMessage)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot send %T", v)
	}
	return *m, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*rawMessage)
	if !ok {
		return fmt.Errorf("rawCodec: cannot take %T", v)
	}
	*m = append((*m)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func readBatches(path string) ([][]int64, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var batches [][]int64
	lines := bufio.NewScanner(file)
	lines.Buffer(make([]byte, 1<<20), 1<<24)
	for n := 1; lines.Scan(); n++ {
		fields := split(lines.Text())
		if len(fields) == 0 {
			continue
		}
		ids := make([]int64, len(fields))
		for i, field := range fields {
			id, err := strconv.ParseInt(field, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: id %q is not an int64", path, n, field)
			}
			ids[i] = id
		}
		batches = append(batches, ids)
	}
	if err := lines.Err(); err != nil {
		return nil, err
	}
	if len(batches) == 0 {
		return nil, fmt.Errorf("%s: no batches", path)
	}
	return batches, nil
}

func split(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "feature-load:", err)
	os.Exit(1)
}
