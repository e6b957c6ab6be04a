package ca

import (
	"context"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Repeat calls step until ctx ends: again after the wait step returns, or, when it fails,
// after a back-off (0.5 s doubling up to 30 s, reset by a success), telling failed the error
// and the wait. It is how the CA's store is read again and a serving certificate renewed.
func Repeat(ctx context.Context, step func(context.Context) (time.Duration, error), failed func(err error, retryIn time.Duration)) {
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 30 * time.Second}
	}
	backoff := newBackoff()
	for {
		next, err := step(ctx)
		if err != nil {
			next = backoff.Step()
			failed(err, next)
		} else {
			backoff = newBackoff()
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// RefreshInterval is how often Run reads the CA's store again.
const RefreshInterval = time.Minute

// Run reads the CA's store again every RefreshInterval (retrying sooner while it cannot be
// read: the API server away), until ctx ends.
func (k *Keeper) Run(ctx context.Context) error {
	Repeat(ctx, func(ctx context.Context) (time.Duration, error) {
		_, err := k.Refresh(ctx)
		return RefreshInterval, err
	}, func(err error, retryIn time.Duration) {
		k.log.Error("CA not loaded; retrying", "retryIn", retryIn.String(), "error", err)
	})
	return nil
}
