package main

import (
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	// 1..1000 ms: the p-th percentile of n samples is the ceil(p*n)-th smallest.
	var samples []time.Duration
	for i := 1; i <= 1000; i++ {
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	for permille, want := range map[int]int{500: 500, 900: 900, 990: 990, 999: 999, 1000: 1000, 1: 1, 0: 1} {
		if got := percentile(samples, permille); got != time.Duration(want)*time.Millisecond {
			t.Errorf("percentile(1..1000, %d‰) = %v, want %dms", permille, got, want)
		}
	}
	// Fewer samples than 1/(1-p): p99.9 of 10 samples is the largest, p50 of 10 is the 5th.
	if got := percentile(samples[:10], 999); got != 10*time.Millisecond {
		t.Errorf("p99.9 of 10 = %v", got)
	}
	if got := percentile(samples[:10], 500); got != 5*time.Millisecond {
		t.Errorf("p50 of 10 = %v", got)
	}
	if got := percentile(nil, 990); got != 0 {
		t.Errorf("p99 of none = %v", got)
	}
}

func TestScheduleCountsAndDrift(t *testing.T) {
	// The scheduler's loop: due while offset < warm-up + duration, measured from the warm-up on.
	count := func(rate float64, warmup, duration time.Duration) (all, measured int) {
		for i := int64(0); offset(i, rate) < warmup+duration; i++ {
			all++
			if offset(i, rate) >= warmup {
				measured++
			}
		}
		return all, measured
	}
	for _, c := range []struct {
		rate             float64
		warmup, duration time.Duration
		all, measured    int
	}{
		{1000, 2 * time.Second, 10 * time.Second, 12000, 10000},
		{3, 0, time.Second, 3, 3},
		{7, time.Second, 3 * time.Second, 28, 21},
	} {
		all, measured := count(c.rate, c.warmup, c.duration)
		if all != c.all || measured != c.measured {
			t.Errorf("rate %v warm-up %v duration %v: %d due, %d measured; want %d, %d",
				c.rate, c.warmup, c.duration, all, measured, c.all, c.measured)
		}
	}
	// 1/3 s does not round to whole nanoseconds; a million intervals must still end on time.
	if got := offset(3_000_000, 3); got != 1_000_000*time.Second {
		t.Errorf("offset(3e6, 3/s) = %v, want 1e6 s", got)
	}
}
