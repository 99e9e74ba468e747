// An open-loop, fixed-rate HTTPS load generator for bench/run.py (Go stdlib only).
//
// wrk is closed-loop: each connection sends its next request only after the previous response,
// so a slow response also delays the requests that should have been sent meanwhile, and the
// percentiles never see that queueing (coordinated omission). Here request i is due at
// start + i/rate whatever the server does, and its latency runs from that due time to the end of
// its response body: time spent waiting for a free connection counts.
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// job is one scheduled request.
type job struct {
	due      time.Time
	measured bool // false during the warm-up: sent, but left out of the report
}

// tally is what one connection's worker saw; each worker owns its own, so no locking.
type tally struct {
	latencies       []time.Duration // measured requests that got a response (any status)
	transport       int             // measured requests that got no response (dial, TLS, timeout, reset)
	non2xx          int
	warmupCompleted int
	lastDone        time.Time // end of the last measured response
	proto           string
}

// offset is when request i is due, relative to the start. Computed from i rather than by adding
// up intervals, so rounding 1/rate to nanoseconds never accumulates into drift.
func offset(i int64, rate float64) time.Duration {
	return time.Duration(float64(i) * float64(time.Second) / rate)
}

// percentile returns the nearest-rank percentile of sorted samples: the smallest sample with at
// least permille/1000 of all samples at or below it. Per mille in integers (p99.9 = 999), because
// ceil(0.999*n) in floating point can land one rank too high.
func percentile(sorted []time.Duration, permille int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (permille*len(sorted) + 999) / 1000
	return sorted[max(rank, 1)-1]
}

// conn is one keep-alive HTTP/1.1 connection of the pool, driven by one worker goroutine: write
// the request, read the response, repeat. No net/http Transport: its per-request goroutine
// handoffs cost about 40% more client CPU, taken from the server this shares a host with.
type conn struct {
	dial func() (net.Conn, error)
	c    net.Conn
	br   *bufio.Reader
}

// roundTrip sends the prebuilt request and reads the whole response. On any error, or if the
// server asks to close, the connection is dropped and the next request dials a new one.
func (c *conn) roundTrip(request []byte, timeout time.Duration) (status int, proto string, err error) {
	if c.c == nil {
		if c.c, err = c.dial(); err != nil {
			return 0, "", err
		}
		c.br = bufio.NewReaderSize(c.c, 64<<10)
	}
	keep := false
	if err = c.c.SetDeadline(time.Now().Add(timeout)); err == nil {
		if _, err = c.c.Write(request); err == nil {
			var resp *http.Response
			if resp, err = http.ReadResponse(c.br, nil); err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status, proto, keep = resp.StatusCode, resp.Proto, !resp.Close
			}
		}
	}
	if err != nil || !keep {
		c.c.Close()
		c.c = nil
	}
	return status, proto, err
}

// buildRequest renders the one request every send repeats (headers and body are constant).
func buildRequest(target string, body []byte) ([]byte, error) {
	method := http.MethodGet
	if body != nil {
		method = http.MethodPost
	}
	req, err := http.NewRequest(method, target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	var buf bytes.Buffer
	if err := req.Write(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// dialer connects to the URL's host; https verifies the certificate and offers only http/1.1.
func dialer(target *url.URL, tlsConfig *tls.Config) func() (net.Conn, error) {
	addr := target.Host
	if target.Port() == "" {
		addr = net.JoinHostPort(target.Hostname(), map[string]string{"http": "80", "https": "443"}[target.Scheme])
	}
	if target.Scheme == "http" {
		return func() (net.Conn, error) { return net.DialTimeout("tcp", addr, 5*time.Second) }
	}
	config := tlsConfig.Clone()
	config.NextProtos = []string{"http/1.1"}
	if config.ServerName == "" {
		config.ServerName = target.Hostname()
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: config}
	return func() (net.Conn, error) { return d.Dial("tcp", addr) }
}

func worker(c *conn, request []byte, timeout time.Duration, jobs <-chan job, slots <-chan struct{}, t *tally) {
	for j := range jobs {
		status, proto, err := c.roundTrip(request, timeout)
		done := time.Now()
		<-slots
		switch {
		case !j.measured:
			if err == nil {
				t.warmupCompleted++
			}
		case err != nil:
			t.transport++
		default:
			t.latencies = append(t.latencies, done.Sub(j.due))
			t.lastDone = done
			t.proto = proto
			if status < 200 || status > 299 {
				t.non2xx++
			}
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	return float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
}

type latencyReport struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99.9"`
	Max  float64 `json:"max"`
}

type report struct {
	URL          string  `json:"url"`
	Proto        string  `json:"proto"`
	Connections  int     `json:"connections"`
	DurationS    float64 `json:"duration_s"`
	TargetRate   float64 `json:"target_rate"`
	AchievedRate float64 `json:"achieved_rate"` // completed per second of the window (or until the last response, if later)
	Scheduled    int     `json:"scheduled"`
	Sent         int     `json:"sent"`
	Dropped      int     `json:"dropped"` // due while -max-inflight requests were outstanding; never sent
	Completed    int     `json:"completed"`
	Errors       struct {
		Transport int `json:"transport"`
		Non2xx    int `json:"non_2xx"`
	} `json:"errors"`
	LatencyMs       latencyReport `json:"latency_ms"`
	MaxSendLagMs    float64       `json:"max_send_lag_ms"` // how late the scheduler itself woke up
	WarmupCompleted int           `json:"warmup_completed"`
	LoadgenCPUS     float64       `json:"loadgen_cpu_s"` // this process, warm-up included
}

func main() {
	rawURL := flag.String("url", "", "target URL, https:// or http:// (required)")
	bodyFile := flag.String("body", "", "POST this file as application/json (default: GET)")
	caFile := flag.String("ca", "", "verify the server certificate against this CA bundle (default: system roots)")
	serverName := flag.String("servername", "", "TLS server name to verify (default: the URL's host)")
	rate := flag.Float64("rate", 1000, "requests per second, scheduled at fixed intervals")
	duration := flag.Duration("duration", 10*time.Second, "measured duration")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured warm-up at the same rate, before -duration")
	connections := flag.Int("connections", 8, "fixed pool of keep-alive HTTP/1.1 connections")
	maxInflight := flag.Int("max-inflight", 1000, "bound on outstanding requests (queued + on the wire); beyond it a due request is dropped and counted")
	timeout := flag.Duration("timeout", 10*time.Second, "per-request timeout on the wire (the wait for a free connection is not cut short)")
	flag.Parse()
	if *rawURL == "" || *rate <= 0 || *duration <= 0 || *warmup < 0 || *connections < 1 || *maxInflight < 1 {
		flag.Usage()
		os.Exit(2)
	}

	var body []byte
	if *bodyFile != "" {
		var err error
		if body, err = os.ReadFile(*bodyFile); err != nil {
			log.Fatal(err)
		}
	}
	target, err := url.Parse(*rawURL)
	if err != nil || (target.Scheme != "https" && target.Scheme != "http") {
		log.Fatalf("-url %q: want an http:// or https:// URL", *rawURL)
	}
	request, err := buildRequest(*rawURL, body)
	if err != nil {
		log.Fatal(err)
	}
	tlsConfig := &tls.Config{ServerName: *serverName}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			log.Fatal(err)
		}
		tlsConfig.RootCAs = x509.NewCertPool()
		if !tlsConfig.RootCAs.AppendCertsFromPEM(pem) {
			log.Fatalf("%s: no PEM certificates", *caFile)
		}
	}

	// jobs is buffered to the in-flight bound, and slots counts outstanding requests, so the
	// scheduler never blocks: a request finding all connections busy waits in jobs, and one
	// finding max-inflight outstanding is dropped rather than silently sent late.
	jobs := make(chan job, *maxInflight)
	slots := make(chan struct{}, *maxInflight)
	tallies := make([]tally, *connections)
	var wg sync.WaitGroup
	for i := range tallies {
		c := &conn{dial: dialer(target, tlsConfig)}
		wg.Go(func() { worker(c, request, *timeout, jobs, slots, &tallies[i]) })
	}

	var r report
	var maxLag time.Duration
	start := time.Now()
	windowStart := start.Add(*warmup)
	for i := int64(0); ; i++ {
		off := offset(i, *rate)
		if off >= *warmup+*duration {
			break
		}
		due := start.Add(off)
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		// If the scheduler wakes late (GC, a busy CPU), the due requests go out at once and keep
		// their due times: the lateness is charged to them, not hidden.
		measured := off >= *warmup
		if measured {
			r.Scheduled++
			maxLag = max(maxLag, time.Since(due))
		}
		select {
		case slots <- struct{}{}:
			jobs <- job{due: due, measured: measured}
			if measured {
				r.Sent++
			}
		default:
			if measured {
				r.Dropped++
			}
		}
	}
	close(jobs)
	wg.Wait()

	var latencies []time.Duration
	var lastDone time.Time
	for _, t := range tallies {
		latencies = append(latencies, t.latencies...)
		r.Errors.Transport += t.transport
		r.Errors.Non2xx += t.non2xx
		r.WarmupCompleted += t.warmupCompleted
		if t.lastDone.After(lastDone) {
			lastDone = t.lastDone
		}
		if t.proto != "" {
			r.Proto = t.proto
		}
	}
	slices.Sort(latencies)
	r.URL, r.Connections, r.DurationS, r.TargetRate = *rawURL, *connections, duration.Seconds(), *rate
	r.Completed = len(latencies)
	if r.Completed > 0 {
		// Over the measured window, stretched if the last responses trail past its end.
		r.AchievedRate = float64(r.Completed) / max(*duration, lastDone.Sub(windowStart)).Seconds()
	}
	r.LatencyMs = latencyReport{P50: ms(percentile(latencies, 500)), P90: ms(percentile(latencies, 900)),
		P99: ms(percentile(latencies, 990)), P999: ms(percentile(latencies, 999)), Max: ms(percentile(latencies, 1000))}
	r.MaxSendLagMs = ms(maxLag)
	r.LoadgenCPUS = cpuSeconds()
	out, err := json.Marshal(r)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(out))
}
