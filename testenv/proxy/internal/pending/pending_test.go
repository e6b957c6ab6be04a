package pending

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestWaitReturnsWhenTheLastPieceIsDone(t *testing.T) {
	var c Count
	assert.True(t, c.Wait(context.Background()), "nothing in progress: at once")

	c.Add()
	c.Add()
	waited := make(chan bool)
	go func() { waited <- c.Wait(context.Background()) }()
	c.Done()
	select {
	case <-waited:
		t.Fatal("Wait returned with one piece still in progress")
	case <-time.After(50 * time.Millisecond):
	}
	c.Done()
	select {
	case ok := <-waited:
		assert.True(t, ok)
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return once the count reached zero")
	}

	c.Add() // the count is reusable after reaching zero
	again := make(chan bool)
	go func() { again <- c.Wait(context.Background()) }()
	c.Done()
	select {
	case ok := <-again:
		assert.True(t, ok)
	case <-time.After(5 * time.Second):
		t.Fatal("a second Wait did not return")
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	var c Count
	c.Add()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.False(t, c.Wait(ctx), "work still in progress when the context ended")
}

func TestDoneWithoutAddPanics(t *testing.T) {
	var c Count
	assert.PanicsWithValue(t, "pending: Done without Add", c.Done)
}
